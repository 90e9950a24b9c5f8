package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the module's PostgreSQL driver, as "pgx"
)

func pingPostgres(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// newSchema creates a scratch schema for one contender and scenario and
// returns dsn with its search_path pointing there, so that the module's
// and the floor's tables never meet each other, or those of other users of
// the database.
func newSchema(ctx context.Context, env *environment, prefix string) (string, error) {
	env.mu.Lock()
	name := fmt.Sprintf("locks_bench_%d_%s_%d", pid, prefix, len(env.schemas))
	env.schemas = append(env.schemas, name)
	env.mu.Unlock()
	conn, err := pgx.Connect(ctx, env.postgresDSN)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	u, err := url.Parse(env.postgresDSN)
	if err != nil {
		return "", fmt.Errorf("the PostgreSQL DSN must be a postgres:// URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func dropSchemas(dsn string, names []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var errs []error
	for _, n := range names {
		_, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{n}.Sanitize()+" CASCADE")
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// floorPostgres is a hand-written lease: acquire is one upsert that takes
// a free or expired row (with a new token), release one delete; same
// driver (pgx through database/sql), same table and the same pool size
// as the module (10 connections).
type floorPostgres struct {
	db           *sql.DB
	acquire, del *sql.Stmt
}

const (
	floorPGAcquire = `INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (resource_type, resource_id) DO UPDATE
SET id = nextval(pg_get_serial_sequence('locks', 'id')), owner_id = EXCLUDED.owner_id,
    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
WHERE locks.expires_at <= EXCLUDED.acquired_at
RETURNING id`
	floorPGDelete = `DELETE FROM locks WHERE resource_type = $1 AND resource_id = $2 AND owner_id = $3`
)

func openFloorPostgres(ctx context.Context, env *environment) (instance, error) {
	dsn, err := newSchema(ctx, env, "floor")
	if err != nil {
		return nil, err
	}
	if err := createSchema(ctx, dsn); err != nil {
		return nil, err
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	f := &floorPostgres{db: db}
	if f.acquire, err = db.PrepareContext(ctx, floorPGAcquire); err == nil {
		f.del, err = db.PrepareContext(ctx, floorPGDelete)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return f, nil
}

func (f *floorPostgres) close() error { return f.db.Close() }

// callers cycle acquire and release; on the shared resource they retry
// at once while it is held.
func (f *floorPostgres) callers(_ context.Context, n int, shared bool) ([]cycleFunc, error) {
	return perCaller(n, shared, func(ctx context.Context, owner, id string) error {
		for {
			now := time.Now().UTC().Truncate(time.Microsecond)
			var token int64
			err := f.acquire.QueryRowContext(ctx, owner, "plan", id,
				now.Format(timeLayout), now.Add(lockTTL).Format(timeLayout)).Scan(&token)
			if err == nil {
				break
			}
			if !shared || !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		return deleteHeld(ctx, f.del, owner, id)
	}), nil
}

// advisory is PostgreSQL's session advisory locks: each caller holds a
// connection of a pgx pool for the whole scenario (up to advisoryMaxConns
// callers; past it, for each cycle) and takes its locks on it with
// pg_try_advisory_lock. On the shared resource it waits in
// pg_advisory_lock, the server's own queue.
type advisory struct {
	dsn   string
	pool  *pgxpool.Pool
	conns []*pgxpool.Conn
}

// advisoryClass is the first key of the two-key form: that form never
// meets the one-key (bigint) locks that other users of the database take.
var advisoryClass = int32(pid)

func openAdvisory(_ context.Context, env *environment) (instance, error) {
	return &advisory{dsn: env.postgresDSN}, nil
}

// advisoryMaxConns bounds the connections of pg-advisory: a session lock
// lives on a connection, and the server allows 100 by default. Past it
// the callers borrow a connection from the pool for each cycle.
const advisoryMaxConns = 64

func (a *advisory) callers(ctx context.Context, n int, shared bool) ([]cycleFunc, error) {
	cfg, err := pgxpool.ParseConfig(a.dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(min(n, advisoryMaxConns))
	if a.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	out := make([]cycleFunc, n)
	for i := range out {
		var conn *pgxpool.Conn // held for the scenario, or nil: borrowed per cycle
		if n <= advisoryMaxConns {
			if conn, err = a.pool.Acquire(ctx); err != nil {
				return nil, err
			}
			a.conns = append(a.conns, conn)
		}
		k := 0
		out[i] = func(ctx context.Context) error {
			c := conn
			if c == nil {
				var err error
				if c, err = a.pool.Acquire(ctx); err != nil {
					return err
				}
				defer c.Release()
			}
			key := int32(-1)
			if shared {
				if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", advisoryClass, key); err != nil {
					return err
				}
			} else {
				key = int32(i*ownResources + k%ownResources)
				k++
				var got bool
				if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int4, $2::int4)", advisoryClass, key).Scan(&got); err != nil {
					return err
				}
				if !got {
					return fmt.Errorf("advisory lock %d/%d: %w", advisoryClass, key, errBusy)
				}
			}
			var ok bool
			if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", advisoryClass, key).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("advisory lock %d/%d was not held at its release", advisoryClass, key)
			}
			return nil
		}
	}
	return out, nil
}

func (a *advisory) close() error {
	for _, c := range a.conns {
		c.Release()
	}
	if a.pool != nil {
		a.pool.Close()
	}
	return nil
}
