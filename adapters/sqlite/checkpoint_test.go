package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/benbjohnson/clock"
	"github.com/cleveragents/locks/adapters/entstore"
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

// TestCheckpoints_PurgeGrowsTheWALOnce: while purge writes run, the WAL is
// not started over (which would cut a large file back inside a write),
// so it grows; once they stop, the next writes start it over and cut it
// back, in steps, and the writer never copies the purge's backlog itself.
func TestCheckpoints_PurgeGrowsTheWALOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		require.NoError(t, err)
		return fi.Size()
	}
	write := func(kind entstore.WriteKind, i int) {
		require.NoError(t, db.WriteTx(ctx, kind, func(ctx context.Context, tx *sql.Tx) error {
			var x interface {
				ExecContext(context.Context, string, ...any) (sql.Result, error)
			} = db.Writer()
			if tx != nil {
				x = tx
			}
			_, err := x.ExecContext(ctx, "INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at) VALUES ('A', 'plan', ?, '2026-11-30T00:00:00.000000Z', '2099-01-01T00:00:00.000000Z')", fmt.Sprint(kind, "-", i))
			return err
		}))
	}
	for i := range 6000 {
		write(entstore.Cleanup, i)
	}
	grown := walSize()
	assert.Greater(t, grown, int64(32<<20), "the WAL was started over during the purge")
	// It is cut back 16 MiB at a time, as the WAL starts over, every few
	// hundred writes: two steps at least.
	for i := 0; i < 30_000 && walSize() > grown-(32<<20); i++ {
		write(entstore.Statements, i)
	}
	assert.LessOrEqual(t, walSize(), grown-(32<<20), "the WAL, %d bytes after the purge, was not cut back", grown)
	// The writer's step copies what the last background round left: the
	// frames added while it ran (at most 256), and those of the few
	// writes since. Had it run on a call for it made during the purge, it
	// would have copied everything the purge added after that call: about
	// 1,700 frames here.
	assert.LessOrEqual(t, sqlite.WriterCheckpointFrames(db), int64(512), "the writer copied the purge's backlog")
}
