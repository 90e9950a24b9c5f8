package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// ReadOnlySession reports whether the connections of db refuse to write:
// a write sent straight to the server, past the store, fails with
// read_only_sql_transaction.
func ReadOnlySession(t *testing.T, db *DB) bool {
	t.Helper()
	_, err := db.sql.Exec("CREATE TABLE locks_write_probe (id int)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("a write through an inspection connection: %v, want SQLSTATE 25006", err)
		return false
	}
	return true
}

// SessionIsolation returns the isolation level of a statement sent
// through db outside any transaction: the session's default.
func SessionIsolation(t *testing.T, db *DB) string {
	t.Helper()
	var level string
	if err := db.sql.QueryRow("SELECT current_setting('transaction_isolation')").Scan(&level); err != nil {
		t.Fatalf("reading the isolation level: %v", err)
	}
	return level
}

// ResourceKey is the key of a resource's advisory lock, for tests that hold
// it to make a write wait.
var ResourceKey = resourceKey

// Measure measures c's offset to the server now, as its background
// refresh does every ClockRefresh.
func Measure(ctx context.Context, c *ServerClock) error { return c.measure(ctx) }
