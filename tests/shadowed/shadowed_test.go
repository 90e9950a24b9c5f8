// Package shadowed holds an embedder that registers, with the SQLite
// driver, a function whose name differs from the lock store's own only in
// case: SQLite's names ignore case, the driver's registry does not.
package shadowed

import (
	"database/sql/driver"
	"fmt"
	"path/filepath"
	"testing"

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

// The store refuses to open rather than let the other function date its
// locks (which committed rows dated 2000 and reported a failure).
func TestOpen_RefusedWhereItsSQLFunctionIsShadowed(t *testing.T) {
	for i := range 5 {
		db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), fmt.Sprintf("l%d.db", i)), sqlite.Options{})
		if err == nil {
			db.Close()
		}
		require.Error(t, err, "store %d opened", i)
		require.ErrorIs(t, err, domain.ErrUnavailable)
		assert.True(t, domain.IsPermanent(err))
		assert.Contains(t, err.Error(), "cleveragents_locks_time")
		assert.Contains(t, err.Error(), "rename it")
	}
}
