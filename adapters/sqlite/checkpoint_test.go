package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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
// with every write if nothing else did; the checkpointer copies it back
// and the WAL starts over. Each cycle waits for the checkpoint it started:
// whether catch-ups keep up with writes that do not wait is a matter of
// speed, which BenchmarkCheckpoints reports.
func TestCheckpoints(t *testing.T) {
	ctx := context.Background()
	db, path := openStore(t)
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
		sqlite.WaitCheckpoint(db)
	}
	fi, err := os.Stat(path + "-wal")
	require.NoError(t, err)
	assert.Less(t, fi.Size(), int64(32<<20), "the WAL grew to %d bytes", fi.Size())
}

// TestCheckpoints_PurgeGrowsTheWALOnce: while purge writes run, the
// writer's step of a checkpoint never runs (it would start the WAL over,
// and cut a large file back, inside a write), so the WAL grows; once they
// stop, the next writes start it over and cut it back, in steps, and the
// writer never copies the purge's backlog itself.
func TestCheckpoints_PurgeGrowsTheWALOnce(t *testing.T) {
	db, path := openStore(t)
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		require.NoError(t, err)
		return fi.Size()
	}
	write := func(kind entstore.WriteKind, i int) {
		writeSQL(t, db, kind, "INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at) VALUES ('A', 'plan', ?, '2026-11-30T00:00:00.000000Z', '2099-01-01T00:00:00.000000Z')", fmt.Sprint(kind, "-", i))
	}
	// The purge writes until the WAL is large: about 4,000 writes. A
	// catch-up that runs while the writer is descheduled (a loaded
	// machine) copies every frame by itself, and the next write starts the
	// WAL over with no step of the writer's: how many writes that takes
	// depends on the machine, whether the WAL grows does not.
	var grown int64
	for i := 0; i < 60_000 && grown <= 64<<20; i++ {
		write(entstore.Cleanup, i)
		grown = walSize()
	}
	require.Greater(t, grown, int64(64<<20), "the WAL was started over again and again during the purge")
	assert.Zero(t, sqlite.WriterCheckpointFrames(db), "the writer's step of a checkpoint ran during the purge")
	// It is cut back 16 MiB at a time, as the WAL starts over, every few
	// hundred writes: two steps at least. From here on each write waits
	// for the checkpoint it started, so that how busy the machine is does
	// not decide how many frames the writes add behind a catch-up. The
	// purge goes on a while so: a catch-up then copies every frame, and
	// the next write starts the WAL over with no step of the writer's.
	size, restarted := grown, false
	for i := 0; i < 30_000 && size > grown-(32<<20); i++ {
		kind := entstore.Statements
		if !restarted {
			kind = entstore.Cleanup
		}
		write(kind, 100_000+i) // after the purge's ids
		sqlite.WaitCheckpoint(db)
		now := walSize()
		// A step, and the frames of a write or two, written since the
		// limit was set.
		require.LessOrEqual(t, size-now, int64(17<<20), "write %d after the purge cut the WAL from %d to %d bytes at once", i, size, now)
		restarted = restarted || now < size
		size = now
	}
	assert.LessOrEqual(t, size, grown-(32<<20), "the WAL, %d bytes after the purge, was not cut back", grown)
	// The writer's step copies what the last background round left: the
	// frames of the writes since it, a few here. Had it run on a call for
	// it made during the purge, it would have copied everything the purge
	// added after that call: thousands of frames.
	assert.LessOrEqual(t, sqlite.WriterCheckpointFrames(db), int64(512), "the writer copied the purge's backlog")
}

// TestCheckpoints_NextAfter: a catch-up comes after as many writes as
// add about a thousand frames, never more than under ordinary writes and
// never fewer than a handful.
func TestCheckpoints_NextAfter(t *testing.T) {
	for _, tc := range []struct {
		writes int
		frames int64
		want   int
	}{
		{512, 16_000, 32},  // a purge's writes, about 31 frames each
		{64, 640, 102},     // 10 frames each
		{512, 1_024, 512},  // two frames each: as many as ordinary
		{512, 0, 512},      // nothing measured
		{0, 100, 512},      // nothing measured
		{10, 100_000, 16},  // huge writes: the least
		{1, 1, 512},        // one frame a write: the most
		{100, 102_400, 16}, // 1,024 frames each
	} {
		assert.Equal(t, tc.want, sqlite.NextAfter(tc.writes, tc.frames), "%d writes, %d frames", tc.writes, tc.frames)
	}
}

// TestCheckpoints_FollowAPurge: while a purge's large writes run,
// catch-ups come after fewer writes, so that each copies about as much as
// under ordinary writes, and write out what they copied; once the purge
// is over, they are spaced as before and leave syncing to SQLite.
func TestCheckpoints_FollowAPurge(t *testing.T) {
	db, _ := openStore(t)
	id := 0
	write := func(kind entstore.WriteKind, rows int) {
		args := make([]any, rows)
		values := make([]string, rows)
		for i := range rows {
			id++
			args[i] = fmt.Sprintf("%0200d", id)
			values[i] = "('A', 'plan', ?, '2026-11-30T00:00:00.000000Z', '2099-01-01T00:00:00.000000Z')"
		}
		writeSQL(t, db, kind, "INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at) VALUES "+strings.Join(values, ", "), args...)
		// One write at a time, each checkpoint done before the next
		// write: what a checkpoint finds is what the writes added.
		sqlite.WaitCheckpoint(db)
	}
	require.Equal(t, sqlite.CheckpointAfter, sqlite.CatchUpAfter(db))
	// Each purge write adds about 25 frames: a catch-up is due every 40
	// writes or so, once two catch-ups have measured it.
	for range 2_000 {
		write(entstore.Cleanup, 60)
	}
	during := sqlite.CatchUpAfter(db)
	t.Logf("during the purge: a catch-up every %d writes", during)
	assert.Greater(t, during, sqlite.MinAfter, "the frames a purge's write adds were never measured")
	assert.Less(t, during, sqlite.CheckpointAfter/4, "catch-ups did not come sooner during the purge")
	flushed := sqlite.Flushes(db)
	if runtime.GOOS == "linux" {
		// Each catch-up of the purge wrote out what it had copied.
		assert.Greater(t, flushed, int64(10), "the purge's catch-ups left their pages dirty")
	} else {
		assert.Zero(t, flushed, "syncfs is Linux's")
	}
	for i := 0; i < 20*sqlite.CheckpointAfter && sqlite.CatchUpAfter(db) != sqlite.CheckpointAfter; i++ {
		write(entstore.Statements, 1)
	}
	assert.Equal(t, sqlite.CheckpointAfter, sqlite.CatchUpAfter(db), "catch-ups stayed close after the purge")
	// Ordinary writes leave the syncing to SQLite.
	flushed = sqlite.Flushes(db)
	for range 4 * sqlite.CheckpointAfter {
		write(entstore.Statements, 1)
	}
	assert.Equal(t, flushed, sqlite.Flushes(db), "ordinary writes synced the file system")
}

// openStore opens a lock store on a new file, closed when the test ends.
func openStore(t *testing.T) (db *sqlite.DB, path string) {
	path = filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, path
}

// writeSQL runs one statement as a write of kind: in the batch's
// transaction, or alone on the writing connection when the write runs
// by itself (its tx is nil).
func writeSQL(t *testing.T, db *sqlite.DB, kind entstore.WriteKind, query string, args ...any) {
	require.NoError(t, db.WriteTx(context.Background(), kind, func(ctx context.Context, tx *sql.Tx) error {
		var x interface {
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		} = db.Writer()
		if tx != nil {
			x = tx
		}
		_, err := x.ExecContext(ctx, query, args...)
		return err
	}))
}
