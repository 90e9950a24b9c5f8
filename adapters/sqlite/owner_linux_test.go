//go:build linux

package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

// Distinct owner ids are never refused, however many stores of one file
// claim theirs at once; each is refused to a second store while claimed,
// by its own name, and Close frees it. No owner claims nothing.
func TestOpen_OwnerClaims(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	const n = 64
	dbs := make([]*sqlite.DB, n)
	for i := range dbs {
		db, err := sqlite.Open(ctx, path, sqlite.Options{Owner: fmt.Sprintf("owner-%d", i)})
		require.NoError(t, err, "owner-%d was refused while only other ids were claimed", i)
		dbs[i] = db
		defer func() { _ = dbs[i].Close() }()
	}
	for i := range dbs {
		owner := fmt.Sprintf("owner-%d", i)
		_, err := sqlite.Open(ctx, path, sqlite.Options{Owner: owner})
		var inUse *domain.OwnerInUseError
		require.ErrorAs(t, err, &inUse, "a second store claimed %s", owner)
		assert.Equal(t, owner, inUse.Owner)
		assert.ErrorIs(t, err, domain.ErrOwnerInUse)
		assert.NotErrorIs(t, err, domain.ErrUnavailable)
	}
	require.NoError(t, dbs[7].Close())
	again, err := sqlite.Open(ctx, path, sqlite.Options{Owner: "owner-7"})
	require.NoError(t, err, "Close did not free the owner id")
	dbs[7] = again
	for range 2 {
		db, err := sqlite.Open(ctx, path, sqlite.Options{})
		require.NoError(t, err, "a store without an owner claimed one")
		defer db.Close()
	}
}
