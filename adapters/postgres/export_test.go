package postgres

import (
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
