package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/tests/contract"
)

// MustOpenDB opens a new database file in a temporary directory and closes
// it when the test ends.
func MustOpenDB(tb testing.TB) *sqlite.DB {
	tb.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(tb.TempDir(), "locks.db"), sqlite.Options{})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, db.Close()) })
	return db
}

func TestLockRepository_Contract(t *testing.T) {
	contract.Run(t, func(t *testing.T) application.LockRepository {
		return sqlite.NewLockRepository(MustOpenDB(t))
	})
}
