//go:build linux

package sqlite_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

// A release and a Contended check where nobody waits for the resource,
// in any process, leave the wake file as it was: no write to wake nobody
// (nor, see the strace figures in docs/performance.md, any other system
// call). A watch in another store makes them write again.
func TestWakeups_NoWriteWithoutWaiter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser, waiter := openWake(t, path), openWake(t, path)
	_, stop := waiter.Wakeups().Watch(domain.ResourceRef{Type: domain.ResourcePlan, ID: "other"})
	defer stop()
	before, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	for range 10 {
		assert.False(t, releaser.Wakeups().Contended(wakeRef))
		sqlite.Freed(releaser, wakeRef)
	}
	after, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	assert.Equal(t, before, after, "a release with no waiter wrote the wake file")

	c, stop2 := waiter.Wakeups().Watch(wakeRef)
	defer stop2()
	assert.True(t, releaser.Wakeups().Contended(wakeRef))
	sqlite.Freed(releaser, wakeRef)
	requireWoken(t, c, "a release with a waiter was not heard")
}

// A process that died while it watched leaves its count in the wake file,
// but not its lock: the next Contended check finds nobody and puts the
// count right, so that releases stop writing.
func TestWakeups_CountOfDeadWatcherRepaired(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser := openWake(t, path)
	f, err := os.OpenFile(path+"-wake", os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], 1)
	_, err = f.WriteAt(b[:], sqlite.WakeCountsAt+4*int64(sqlite.WakeSlot(wakeRef)))
	require.NoError(t, err)

	assert.False(t, releaser.Wakeups().Contended(wakeRef), "a dead watcher's count")
	before, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	sqlite.Freed(releaser, wakeRef)
	after, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	assert.Equal(t, before, after, "a release wrote for a dead watcher after the count was put right")
}

// A waiter that begins to watch while the holder releases is never left
// to its fallback read: either the release's check sees the watch and
// writes, or the waiter's look after its Watch sees the release. The two
// stores stand for two processes; a flag stands for the lock's row.
func TestWakeups_WatchRacingRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	waiter, releaser := openWake(t, path), openWake(t, path)
	const rounds = 300
	missed := 0
	for i := range rounds {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: string(rune('a' + i%20))}
		var free atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() {
			free.Store(true) // the release's commit
			sqlite.Freed(releaser, ref)
		})
		c, stop := waiter.Wakeups().Watch(ref)
		require.NotNil(t, c)
		if !free.Load() { // the look after the watch: still held
			select {
			case <-c:
			case <-time.After(500 * time.Millisecond):
				missed++
			}
		}
		wg.Wait()
		stop()
	}
	assert.Zero(t, missed, "waiters missed in %d rounds", rounds)
}

// The counts live in a mapping of the wake file, which anyone who may
// write the file can truncate under every process that maps it. A touch
// of the lost page must not kill the process (SIGBUS): the store stops
// trusting the counts and wakes as if someone watched.
func TestWakeups_TruncatedWakeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser, waiter := openWake(t, path), openWake(t, path)
	c, stop := waiter.Wakeups().Watch(wakeRef)
	require.NoError(t, os.Truncate(path+"-wake", 0))

	assert.True(t, releaser.Wakeups().Contended(wakeRef))
	sqlite.Freed(releaser, wakeRef)
	requireWoken(t, c, "a release after the truncation was not heard")
	stop()
	c, stop = waiter.Wakeups().Watch(wakeRef)
	defer stop()
	sqlite.Freed(releaser, wakeRef)
	requireWoken(t, c, "a watch begun after the truncation was not woken")
}
