package postgres_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

var plan1 = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-1"}

func TestOpen_Unreachable(t *testing.T) {
	// Nothing listens on port 1; the password must not reach the message.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := postgres.Open(ctx, "postgres://app:s3cret-pw@127.0.0.1:1/locks?sslmode=disable&connect_timeout=2", postgres.Options{})
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
	assert.NotContains(t, err.Error(), "s3cret-pw")
	assert.Contains(t, err.Error(), "check the host, port", "advice for a server, not a file")
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:pw@db:5432/locks":             "postgres://app:xxxxx@db:5432/locks",
		"host=db user=app password=pw dbname=locks":   "host=db user=app password=xxxxx dbname=locks",
		"host=db password='p w' dbname=locks":         "host=db password=xxxxx dbname=locks",
		"postgres://db/locks?user=app&password=pw":    "postgres://db/locks?user=app&password=xxxxx",
		"postgres://app@db/locks (no password)":       "postgres://app@db/locks (no password)",
		`failed to connect to "postgres://u:pw@h/db"`: `failed to connect to "postgres://u:xxxxx@h/db"`,
		"postgres://u:s3cr%2ft@h/db":                  "postgres://u:xxxxx@h/db",
		"postgres://u:p@ss@h:5432/db":                 "postgres://u:xxxxx@h:5432/db",
		"postgres://h1:5432,h2:5432/db":               "postgres://h1:5432,h2:5432/db",
		"postgres://u@h:5432/db?x=a@b":                "postgres://u@h:5432/db?x=a@b",
	} {
		assert.Equal(t, want, postgres.Redact(in), in)
	}
}

func TestLockRepository_Schema(t *testing.T) {
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer raw.Close()
	rows, err := raw.Query(`SELECT column_name, data_type, coalesce(character_maximum_length, 0)
		FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'locks' ORDER BY ordinal_position`)
	require.NoError(t, err)
	defer rows.Close()
	var got []string
	for rows.Next() {
		var name, typ string
		var width int
		require.NoError(t, rows.Scan(&name, &typ, &width))
		got = append(got, fmt.Sprintf("%s %s %d", name, typ, width))
	}
	assert.Equal(t, []string{
		"id bigint 0",
		"owner_id character varying 255",
		"resource_type character varying 50",
		"resource_id character varying 255",
		"acquired_at character varying 30",
		"expires_at character varying 30",
		"note character varying 256", // nullable: rows and writers of m4_001 stay valid
	}, got)
}

func TestLockRepository_ReadOnly(t *testing.T) {
	// A standby, or a role whose transactions are read-only: a typed
	// error, and no lock reported as held.
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{}) // migrates while writable
	require.NoError(t, err)
	require.NoError(t, db.Close())

	ro, err := postgres.Open(context.Background(), dsn+"&default_transaction_read_only=on", postgres.Options{})
	require.NoError(t, err, "opening an up-to-date database only reads")
	defer ro.Close()
	svc, err := application.NewLockService(postgres.NewLockRepository(ro), clock.New(), 0)
	require.NoError(t, err)
	_, err = svc.Acquire(context.Background(), "A", plan1, 0)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
	_, err = svc.Get(context.Background(), plan1)
	require.ErrorIs(t, err, domain.ErrNotFound)
}

func TestWithConnectTimeout(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://h/db":                    "postgres://h/db?connect_timeout=10",
		"postgres://h/db?sslmode=disable":    "postgres://h/db?sslmode=disable&connect_timeout=10",
		"postgres://h/db?connect_timeout=3":  "postgres://h/db?connect_timeout=3",
		"host=h dbname=db":                   "host=h dbname=db connect_timeout=10",
		"host=h connect_timeout=3 dbname=db": "host=h connect_timeout=3 dbname=db",
	} {
		assert.Equal(t, want, postgres.WithConnectTimeout(in), in)
	}
}

func TestFormatError_ServerAdvice(t *testing.T) {
	for _, kind := range []domain.StoreErrorKind{domain.StoreUnreachable, domain.StoreReadOnly,
		domain.StoreCorrupt, domain.StoreFull, domain.StoreBusy} {
		advice := postgres.Advice(kind)
		// A StoreError made by the shared store carries the domain's
		// advice, which speaks of a file.
		err := &domain.StoreError{Op: "open lock store", Kind: kind, Err: errors.New("cause")}
		_, file, _ := strings.Cut(err.Error(), "; ")
		file = strings.TrimSuffix(file, ": cause")
		require.NotEmpty(t, file, kind)
		require.Contains(t, err.Error(), file, "the domain's advice is found in its messages")

		got := postgres.FormatError("clean up", err).Error()
		assert.Contains(t, got, advice, kind)
		if !strings.Contains(advice, file) {
			assert.NotContains(t, got, file, kind)
		}
		assert.True(t, strings.HasSuffix(got, ": cause"), got)

		assert.Equal(t, err.Error(), sqlite.FormatError("clean up", err).Error(), "a SQLite file keeps the domain's advice")
	}
}

// A prepared statement of pgx's that the server says does not exist, or
// already exists, on the session the store's connection was given is the
// mark of a pooler that lends sessions per transaction (the store never
// deallocates one, and names them by their text): FormatError says so,
// with the pooler's advice, whatever the statement (the migrations at
// Open, or any later one), and keeps the server's error as the cause.
func TestFormatError_LostPreparedStatementIsPooling(t *testing.T) {
	for _, pgErr := range []*pgconn.PgError{
		{Severity: "ERROR", Code: "26000", Message: `prepared statement "stmtcache_87e7b42a7ea259289bc598af73b2acdfdc5ece2197537a0b" does not exist`},
		{Severity: "ERROR", Code: "42P05", Message: `prepared statement "stmtcache_87e7b42a7ea259289bc598af73b2acdfdc5ece2197537a0b" already exists`},
	} {
		for _, in := range []error{pgErr, fmt.Errorf("sql: %w", pgErr),
			&domain.StoreError{Op: "acquire lock", Kind: domain.StoreInternal, Err: pgErr}} {
			err := postgres.FormatError("migrate lock store", in)
			require.ErrorIs(t, err, postgres.ErrTransactionPooling, "%v", in)
			assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
			assert.ErrorContains(t, err, "pool_mode=session")
			assert.ErrorContains(t, err, pgErr.Code, "the server's error stays in the message")
			var got *pgconn.PgError
			require.ErrorAs(t, err, &got)
			assert.Equal(t, pgErr.Code, got.Code)
			assert.Same(t, err, postgres.FormatError("acquire lock", err), "translated once")
		}
	}
	for _, other := range []error{
		&pgconn.PgError{Code: "42P01", Message: `relation "locks" does not exist`},
		&pgconn.PgError{Code: "26000", Message: `portal "p1" does not exist`},
	} {
		assert.NotErrorIs(t, postgres.FormatError("acquire lock", other), postgres.ErrTransactionPooling, "%v", other)
	}
}

// The store's connections plan for its table as it is (small, churned):
// generic plans, and never a scan where an index serves, unless the URL
// says otherwise.
func TestOpen_PlannerSettings(t *testing.T) {
	dsn := testdb.Postgres(t)
	db := MustOpenDB(t)
	assert.Equal(t, "force_generic_plan", postgres.Setting(t, db, "plan_cache_mode"))
	assert.Equal(t, "off", postgres.Setting(t, db, "enable_seqscan"))

	own, err := postgres.Open(context.Background(), dsn+"&enable_seqscan=on&plan_cache_mode=auto", postgres.Options{})
	require.NoError(t, err)
	defer own.Close()
	assert.Equal(t, "auto", postgres.Setting(t, own, "plan_cache_mode"))
	assert.Equal(t, "on", postgres.Setting(t, own, "enable_seqscan"))
}

// A write that met a connection the driver knows to be bad (closed by
// another caller's cancellation, say) was never sent: it runs again
// rather than tell a caller, on a healthy server, that the store cannot
// be reached.
func TestWrite_RunsAgainOnABadConnection(t *testing.T) {
	for _, bad := range []error{driver.ErrBadConn, fmt.Errorf("exec: %w", driver.ErrBadConn)} {
		runs := 0
		err := postgres.Write(context.Background(), func(context.Context) error {
			if runs++; runs < 3 {
				return bad
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, runs)
	}
}

// A connection whose backend an operator (or a restart of a pooler)
// terminated while it sat idle in the pool is not handed to the next
// call: the server's farewell waits unread on it, and a statement sent on
// it would fail with "terminating connection due to administrator
// command" though nothing was written. Found by an outside review: every
// acquire within a second of the kill failed (12 of 12); past a second,
// the driver's own ping caught it.
func TestAcquire_AfterItsIdleConnectionsWereTerminated(t *testing.T) {
	ctx := context.Background()
	svc, app := mustService(t, testdb.Postgres(t), clock.New()), appName(t)
	admin := rawPG(t, testdb.Postgres(t))

	for i := range 3 {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("terminated-", i)}
		_, err := svc.Acquire(ctx, "A", ref, time.Minute) // the pool holds an idle connection
		require.NoError(t, err)
		var killed int
		require.NoError(t, admin.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND state = 'idle'`, app).Scan(&killed))
		require.NotZero(t, killed)
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
			return n == 0
		}, 10*time.Second, time.Millisecond, "the terminated backends did not exit")

		ok, err := svc.Release(ctx, "A", ref)
		require.NoError(t, err, "a release on a connection terminated while idle failed")
		require.True(t, ok)
		_, err = svc.Acquire(ctx, "A", ref, time.Minute)
		require.NoError(t, err)
	}
}

// A server that accepts the connection and then says nothing is one that
// cannot be reached, for a caller without a deadline of its own: the
// driver's connect_timeout is a deadline of the driver's, and its "context
// deadline exceeded" must not read as the caller's. Found by an outside
// review: Open returned the driver's error as it was, which matched
// neither *domain.StoreError nor domain.ErrUnavailable.
func TestOpen_ASilentServerCannotBeReached(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // accepted, never answered
		}
	}()
	start := time.Now()
	_, err = postgres.Open(context.Background(), fmt.Sprintf("postgres://app@%s/locks?sslmode=disable&connect_timeout=1", ln.Addr()), postgres.Options{})
	require.Less(t, time.Since(start), 10*time.Second)
	var se *domain.StoreError
	require.ErrorAs(t, err, &se, "%v", err)
	assert.Equal(t, domain.StoreUnreachable, se.Kind)
	assert.ErrorIs(t, err, domain.ErrUnavailable)
}

// A read whose connection an operator terminated (pg_terminate_backend,
// a pooler's restart) under it, or just before it, runs again on another:
// a read changes nothing, and the server still answers. Found by a test
// that terminates a full pool's idle backends every 20 ms while 16 callers
// read: 64 of 5,670 reads failed with "terminating connection due to
// administrator command", told that the store could not be reached.
func TestRead_ThroughTerminatedConnections(t *testing.T) {
	ctx := context.Background()
	app := appName(t)
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "read-through-terminations"}
	store, svc := heldBy(t, withParam(t, testdb.Postgres(t), "application_name", app), 2, "A", ref)
	reads := []func() error{
		func() error { _, err := svc.Get(ctx, ref); return err },
		func() error { _, err := store.List(ctx, application.ListFilter{Owner: "A"}); return err },
		func() error { _, err := store.CountExpired(ctx, time.Now()); return err },
	}

	// 16 readers, many more than the pool's 2 connections, so that the
	// pool stays full, while the idle backends are terminated every 40 ms.
	admin := rawPG(t, testdb.Postgres(t))
	var (
		stop  = make(chan struct{})
		wg    sync.WaitGroup
		count atomic.Int64
		errs  = make(chan error, 64)
	)
	for i := range 16 {
		read := reads[i%len(reads)]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				count.Add(1)
				if err := read(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	killed := 0
	for range 40 {
		var n int
		require.NoError(t, admin.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND state = 'idle'`, app).Scan(&n))
		killed += n
		time.Sleep(40 * time.Millisecond) // paces the terminations; nothing waits on it
	}
	close(stop)
	wg.Wait()
	close(errs)
	require.NotZero(t, killed, "no backend was terminated: the test proved nothing")
	for err := range errs {
		t.Errorf("a read failed (%d reads, %d backends terminated): %v", count.Load(), killed, err)
	}
}

// heldBy opens a store on dsn with a pool of conns connections, and a
// service on it in which owner holds ref for a minute.
func heldBy(t *testing.T, dsn string, conns int, owner string, ref domain.ResourceRef) (*postgres.LockRepository, *application.LockService) {
	t.Helper()
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{MaxConns: conns})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	store := postgres.NewLockRepository(db)
	svc, err := application.NewLockService(store, clock.New(), 0)
	require.NoError(t, err)
	_, err = svc.Acquire(context.Background(), owner, ref, time.Minute)
	require.NoError(t, err)
	return store, svc
}
