package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"time"

	_ "modernc.org/sqlite" // the module's SQLite driver, registered as "sqlite"

	"github.com/cleveragents/locks"
)

// The floor's statements are the ones the module's SQLite adapter runs for
// a cycle (adapters/sqlite/bench_test.go's Floor): the select and the
// insert in one immediate transaction, then the delete on its own.
const (
	floorSelect = "SELECT `id`, `owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at` FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ?"
	floorInsert = "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`) VALUES (?, ?, ?, ?, ?) RETURNING `id`"
	floorDelete = "DELETE FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ? AND `owner_id` = ?"
)

// timeLayout is the module's stored time format (adapters/entstore/time.go):
// UTC, microseconds, 27 characters, so that string order is time order.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// sqliteDSN opens path with the module's settings: WAL, synchronous=NORMAL,
// a 5 s busy timeout, and immediate write transactions.
func sqliteDSN(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_busy_timeout=5000&_journal_mode=WAL&_synchronous=NORMAL&_txlock=immediate"
}

// createSchema creates the module's schema in the SQLite file or
// PostgreSQL schema that database names, by opening a container on it
// once, so that the floors write the same table and indexes.
func createSchema(ctx context.Context, database string) error {
	c, err := locks.Open(ctx, locks.Config{Database: database, Owner: "bench-setup"})
	if err != nil {
		return err
	}
	return c.Close()
}

// floorSQLite is a hand-written SQLite lock store: one transaction per
// operation on one writing connection, the module's statements prepared,
// and nothing above them.
type floorSQLite struct {
	db               *sql.DB
	sel, insert, del *sql.Stmt
}

func openFloorSQLite(ctx context.Context, env *environment) (instance, error) {
	return newFloorSQLite(ctx, env.file("floor"))
}

func newFloorSQLite(ctx context.Context, path string) (*floorSQLite, error) {
	if err := createSchema(ctx, path); err != nil {
		return nil, err
	}
	return openFloorFile(ctx, path)
}

// openFloorFile opens the floor on a file that has the schema.
func openFloorFile(ctx context.Context, path string) (*floorSQLite, error) {
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	f := &floorSQLite{db: db}
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{{&f.sel, floorSelect}, {&f.insert, floorInsert}, {&f.del, floorDelete}} {
		if *p.stmt, err = db.PrepareContext(ctx, p.query); err != nil {
			db.Close()
			return nil, err
		}
	}
	return f, nil
}

func (f *floorSQLite) close() error { return f.db.Close() }

// callers cycle acquire and release; on the shared resource they retry
// at once while it is held.
func (f *floorSQLite) callers(_ context.Context, n int, shared bool) ([]cycleFunc, error) {
	return perCaller(n, shared, func(ctx context.Context, owner, id string) error {
		return f.cycle(ctx, owner, id, shared)
	}), nil
}

// cycle acquires id (retrying at once while it is held, if retry) and
// releases it.
func (f *floorSQLite) cycle(ctx context.Context, owner, id string, retry bool) error {
	for {
		err := f.acquire(ctx, owner, id)
		if err == nil {
			break
		}
		if !retry || !errors.Is(err, errBusy) {
			return err
		}
	}
	return f.release(ctx, owner, id)
}

// release deletes owner's lock on id, which it must hold.
func (f *floorSQLite) release(ctx context.Context, owner, id string) error {
	return deleteHeld(ctx, f.del, owner, id)
}

// deleteHeld runs a floor's delete (its arguments: type, id, owner) of a
// lock that owner must hold.
func deleteHeld(ctx context.Context, del *sql.Stmt, owner, id string) error {
	res, err := del.ExecContext(ctx, "plan", id, owner)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("release: %d rows, %v", n, err)
	}
	return nil
}

// acquire takes the lock on a free resource: the read and the insert in
// one immediate transaction, as the adapter does.
func (f *floorSQLite) acquire(ctx context.Context, owner, id string) (err error) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	tx, err := f.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: _txlock in the DSN
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	switch err := tx.StmtContext(ctx, f.sel).QueryRowContext(ctx, "plan", id).
		Scan(new(int64), new(string), new(string), new(string), new(string), new(string)); {
	case err == nil:
		return errBusy
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	var token int64
	err = tx.StmtContext(ctx, f.insert).QueryRowContext(ctx, owner, "plan", id,
		now.Format(timeLayout), now.Add(lockTTL).Format(timeLayout)).Scan(&token)
	if err != nil {
		return err
	}
	return tx.Commit()
}
