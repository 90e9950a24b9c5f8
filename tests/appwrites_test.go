package tests

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// appWritesFor is how long TestAppWrites_KeepAliveWins writes: the issue's
// 60 s with LOCKS_APPWRITES=60s, a few TTLs by default.
func appWritesFor(t *testing.T) time.Duration {
	if s := os.Getenv("LOCKS_APPWRITES"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "LOCKS_APPWRITES")
		return d
	}
	if testing.Short() {
		t.Skip("writes for 2 × 6 s of real time")
	}
	return 6 * time.Second
}

// A stream of the application's own write transactions, opened on the lock
// file as docs/lifecycle.md says, must not starve the keep-alive of a lock:
// one goroutine runs back-to-back 3 ms BEGIN IMMEDIATE transactions while a
// 5 s lock (the shortest TTL) is kept alive. The test runs in real time,
// since it is about SQLite's busy handler, but asserts no timing: the lock
// is never lost. Before the application's writes could join the module's
// writer queue (they ran on its own *sql.DB on sqlite.DSN, as
// docs/lifecycle.md then said), with LOCKS_APPWRITES=60s the lock was lost
// after 22.7 s: "the kept-alive lock was lost after 6649 application
// writes: ... the store failed every renewal until the lock expired".
//
// The other container stands for another process on the file: its writes
// and this one's queue on the kernel file lock beside the database.
func TestAppWrites_KeepAliveWins(t *testing.T) {
	d := appWritesFor(t)
	t.Run("SameContainer", func(t *testing.T) { testKeepAliveWins(t, d, false) })
	t.Run("OtherContainer", func(t *testing.T) { testKeepAliveWins(t, d, true) })
}

func testKeepAliveWins(t *testing.T, d time.Duration, other bool) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "app"})
	require.NoError(t, err)
	defer c.Close()
	writer := c
	if other {
		writer, err = locks.Open(ctx, locks.Config{Database: path, Owner: "writer"})
		require.NoError(t, err)
		defer writer.Close()
	}
	require.NoError(t, writer.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "CREATE TABLE app (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
		return err
	}))

	h, err := c.Locks.Take(ctx, "app", domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"},
		application.AcquireOptions{TTL: domain.MinLockTTL})
	require.NoError(t, err)
	held := h.KeepAlive(ctx)

	stop := time.After(d)
	writes := 0
	for {
		select {
		case <-held.Done():
			t.Fatalf("the kept-alive lock was lost after %d application writes: %v", writes, context.Cause(held))
		case <-stop:
			_, err := h.Release(ctx)
			require.NoError(t, err)
			t.Logf("%d application writes in %v, the lock held throughout", writes, d)
			return
		default:
		}
		require.NoError(t, writer.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO app (note) VALUES ('x')"); err != nil {
				return err
			}
			time.Sleep(3 * time.Millisecond) // the application's work inside its transaction
			return nil
		}))
		writes++
	}
}

// Container.Write serves SQLite only, and refuses once Close has begun.
func TestAppWrites_ContainerWrite(t *testing.T) {
	ctx := context.Background()
	noop := func(context.Context, *sql.Tx) error { return nil }
	t.Run("Memory", func(t *testing.T) {
		c, err := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase})
		require.NoError(t, err)
		defer c.Close()
		err = c.Write(ctx, noop)
		require.True(t, domain.IsStoreKind(err, domain.StoreInternal), "%v", err)
		require.Contains(t, err.Error(), "PostgreSQL")
	})
	t.Run("AfterClose", func(t *testing.T) {
		c, err := locks.Open(ctx, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db")})
		require.NoError(t, err)
		require.NoError(t, c.Write(ctx, noop))
		require.NoError(t, c.Close())
		require.ErrorIs(t, c.Write(ctx, noop), domain.ErrClosed)
	})
}
