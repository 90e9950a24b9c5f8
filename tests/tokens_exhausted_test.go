package tests

import (
	"context"
	"database/sql"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// TestTokensExhausted_SQLite: once the locks table's AUTOINCREMENT has
// issued the largest token SQLite can store, SQLite refuses the next
// insert with SQLITE_FULL, the code of a full disk. The caller is told
// that the fencing tokens are used up, and what to do, not to free disk
// space; a real full database still says so (TestHostileDB_Full).
func TestTokensExhausted_SQLite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	c := MustOpen(t, locks.Config{Database: path, Owner: "A"})
	_, err := c.Locks.Acquire(ctx, "A", stressResources[0], 0)
	require.NoError(t, err)

	// Another connection moves the sequence to its end, as 2^63-1
	// acquisitions would.
	raw, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=5000")
	require.NoError(t, err)
	_, err = raw.Exec("UPDATE sqlite_sequence SET seq = ? WHERE name = 'locks'", int64(math.MaxInt64))
	require.NoError(t, err)
	require.NoError(t, raw.Close())

	_, err = c.Locks.Acquire(ctx, "A", stressResources[1], 0)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.False(t, domain.IsStoreKind(err, domain.StoreFull), "not a full disk: %v", err)
	assert.True(t, domain.IsStoreKind(err, domain.StoreTokensExhausted), "%v", err)
	assert.NotContains(t, err.Error(), "free disk space")
	assert.Contains(t, err.Error(), "has issued its last fencing token")
	assert.Contains(t, err.Error(), "9223372036854775807")
	assert.Contains(t, err.Error(), "move the service to a new lock database")
	_, err = c.Locks.Get(ctx, stressResources[1])
	require.ErrorIs(t, err, domain.ErrNotFound, "the lock that got no token is not held")
}
