// Package testdb gives tests a PostgreSQL database of their own when a
// server is configured, and skips them when not.
package testdb

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	_ "github.com/cleveragents/locks/adapters/postgres" // lets locks.Open take the DSNs it gives
)

// EnvPostgres names the server the PostgreSQL tests use, for example
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable. Without it they
// skip, so that go test ./... passes on a machine without PostgreSQL;
// .ci/run sets it.
const EnvPostgres = "LOCKS_TEST_POSTGRES_DSN"

var schemas atomic.Int64

// PostgresAvailable reports whether EnvPostgres is set.
func PostgresAvailable() bool { return os.Getenv(EnvPostgres) != "" }

// EnvPgBouncerSession and EnvPgBouncerTransaction name PgBouncers in
// front of a test server (the same as EnvPostgres's, or another), in
// session and in transaction pool mode, for example
// postgres://postgres@127.0.0.1:16433/test?sslmode=disable. The tests of
// the store behind a pooler skip without them; .ci/run starts both.
const (
	EnvPgBouncerSession     = "LOCKS_TEST_PGBOUNCER_SESSION_DSN"
	EnvPgBouncerTransaction = "LOCKS_TEST_PGBOUNCER_TRANSACTION_DSN"
	// EnvPgBouncerRoundRobin names a PgBouncer in transaction mode that
	// hands its server sessions out in turn (server_round_robin=1) from
	// a pool of two (default_pool_size=2): the pool that a client which
	// reads its session's process id twice can take for session mode.
	EnvPgBouncerRoundRobin = "LOCKS_TEST_PGBOUNCER_ROUNDROBIN_DSN"
)

// PgBouncer returns the DSN of the PgBouncer that env (EnvPgBouncerSession,
// EnvPgBouncerTransaction or EnvPgBouncerRoundRobin) names, whose search_path is a new, empty
// schema of the server behind it, dropped when the test ends; it skips the
// test when env is not set. The schema is made through the pooler itself,
// on the simple protocol, which any pool mode carries.
func PgBouncer(tb testing.TB, env string) string {
	tb.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		tb.Skipf("tests behind a connection pooler skipped: set %s to the DSN of a PgBouncer to run them", env)
	}
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("%s must be a postgres:// URL", env)
	}
	admin := *u
	q := admin.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	admin.RawQuery = q.Encode()
	schema := fmt.Sprintf("locks_test_pgb_%d_%d", os.Getpid(), schemas.Add(1))
	if err := adminExec(admin.String(), "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("creating a scratch schema through the PgBouncer of %s: %v", env, err)
	}
	tb.Cleanup(func() {
		if err := adminExec(admin.String(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Errorf("dropping the scratch schema %s: %v", schema, err)
		}
	})
	q = u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Postgres returns a DSN whose search_path is a new, empty schema of the
// test server, dropped when the test ends; it skips the test when
// EnvPostgres is not set.
func Postgres(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(EnvPostgres)
	if dsn == "" {
		tb.Skipf("PostgreSQL tests skipped: set %s to a server's DSN to run them", EnvPostgres)
	}
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("%s must be a postgres:// URL", EnvPostgres)
	}
	schema := fmt.Sprintf("locks_test_%d_%d", os.Getpid(), schemas.Add(1))
	if err := adminExec(dsn, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("creating a scratch schema on the server of %s: %v", EnvPostgres, err)
	}
	tb.Cleanup(func() {
		if err := adminExec(dsn, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Errorf("dropping the scratch schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// adminExec runs one statement on a connection of its own, closed at once:
// tests that make many schemas must not hold a connection for each.
func adminExec(dsn, query string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(query)
	return err
}
