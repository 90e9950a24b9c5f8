package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/benbjohnson/clock"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// TestCheckpoints: the writer never checkpoints, so the WAL would grow
// with every write if nothing else did; the checkpointer keeps it to a
// few thousand pages while writes go on.
func TestCheckpoints(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	svc, err := application.NewLockService(sqlite.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	// Each cycle appends about 8 pages (4 KiB each) to the WAL: 4,000
	// cycles are 128 MiB without checkpoints.
	for i := range 4000 {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p" + string(rune('a'+i%26))}
		_, err := svc.Acquire(ctx, "alice", ref, time.Minute)
		require.NoError(t, err)
		_, err = svc.Release(ctx, "alice", ref)
		require.NoError(t, err)
	}
	fi, err := os.Stat(path + "-wal")
	require.NoError(t, err)
	assert.Less(t, fi.Size(), int64(32<<20), "the WAL grew to %d bytes", fi.Size())
}
