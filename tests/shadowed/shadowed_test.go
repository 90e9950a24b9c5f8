// Package shadowed holds an embedder that registers, with the SQLite
// driver, a function whose name differs from the lock store's own only in
// case: SQLite's names ignore case, the driver's registry does not.
package shadowed

import (
	"context"
	"database/sql/driver"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	msqlite "modernc.org/sqlite"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

func init() {
	msqlite.MustRegisterScalarFunction("CLEVERAGENTS_LOCKS_TIME", 2,
		func(*msqlite.FunctionContext, []driver.Value) (driver.Value, error) {
			return "2000-01-01T00:00:00.000000Z", nil
		})
}

// The other function never dates the store's locks (it did on some
// connections: rows dated 2000 were committed and the acquire failed),
// and Open is not refused for it.
func TestAcquire_DatedByTheStoreBesideAFunctionOfTheSameName(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	at := func() (time.Time, time.Time) { return now, now.Add(time.Minute) }
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p"}
	for i := range 20 {
		db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), fmt.Sprintf("l%d.db", i)), sqlite.Options{})
		require.NoError(t, err, "store %d", i)
		repo := sqlite.NewLockRepository(db)
		out, err := repo.AcquireAt(context.Background(), ref, "alice", at)
		require.NoError(t, err, "store %d", i)
		assert.Equal(t, now.Add(time.Minute), out.Lock.ExpiresAt, "store %d", i)
		got, err := repo.Get(context.Background(), ref)
		require.NoError(t, err)
		assert.Equal(t, now, got.AcquiredAt, "store %d: the row's date", i)
		require.NoError(t, db.Close())
	}
}
