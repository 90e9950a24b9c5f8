//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package sqlite_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

// TestWriterQueue holds the processes' writer lock as another process
// would, through its own open file: a write waits for it, gives up after
// the busy timeout with a busy StoreError, and once the lock is let go,
// the lock store neither keeps it (the flock it gave up on is let go as
// soon as it is granted) nor fails to write.
func TestWriterQueue(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{BusyTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	repo := sqlite.NewLockRepository(db)
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}

	other, err := os.OpenFile(path+"-lock", os.O_RDWR, 0)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, syscall.Flock(int(other.Fd()), syscall.LOCK_EX))

	_, err = repo.DeleteOwned(ctx, ref, "alice")
	var se *domain.StoreError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, domain.StoreBusy, se.Kind, "%v", err)

	require.NoError(t, syscall.Flock(int(other.Fd()), syscall.LOCK_UN))
	assert.Eventually(t, func() bool {
		if syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return false
		}
		return syscall.Flock(int(other.Fd()), syscall.LOCK_UN) == nil
	}, 10*time.Second, time.Millisecond, "the store kept the writer lock it had given up on")

	_, err = repo.DeleteOwned(ctx, ref, "alice")
	require.NoError(t, err)
}

// TestWriterQueue_SharedDatabase: a database that several users may write
// (made so by its owner) stays writable for all of them, whoever created
// the side file: another user who cannot open it writes without the
// queue, through SQLite's busy handler, instead of failing to open.
func TestWriterQueue_SharedDatabase(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to write the database as another user (nobody)")
	}
	ctx := context.Background()
	path := filepath.Join(reachableDir(t, 0o777), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	side, err := os.Stat(path + "-lock")
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), side.Mode().Perm(), "the side file has the database's mode")
	require.NoError(t, os.Chmod(path, 0o666)) // the owner shares the database, not the side file

	cmd := worker(t, "write", path, true, countEnv+"=3")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the writer failed: see its output above")
	assert.Equal(t, "committed\n", line)
	stdin.Close()
	require.NoError(t, cmd.Wait())
}
