//go:build linux

package sqlite_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
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
	setCountAt(t, path, sqlite.WakeSlot(wakeRef), 1)

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

func countAt(t *testing.T, path string, slot int) uint32 {
	t.Helper()
	b, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	at := sqlite.WakeCountsAt + 4*slot
	require.Greater(t, len(b), at+4)
	return binary.NativeEndian.Uint32(b[at:])
}

func setCountAt(t *testing.T, path string, slot int, n uint32) {
	t.Helper()
	f, err := os.OpenFile(path+"-wake", os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], n)
	_, err = f.WriteAt(b[:], sqlite.WakeCountsAt+4*int64(slot))
	require.NoError(t, err)
}

// A release of all an owner's locks where nobody waits anywhere writes
// nothing, even over the count a dead watcher left, and puts that right.
func TestWakeups_ReleaseAllOverADeadWatchersCount(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser := openWake(t, path)
	slot := sqlite.WakeSlot(wakeRef)
	setCountAt(t, path, slot, 1)
	before, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	sqlite.FreedAll(releaser)
	after, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before[:sqlite.WakeCountsAt], after[:sqlite.WakeCountsAt]), "a release-all with no waiter wrote the slots")
	assert.Zero(t, countAt(t, path, slot), "the dead watcher's count")

	waiter := openWake(t, path)
	c, stop := waiter.Wakeups().Watch(domain.ResourceRef{Type: domain.ResourcePlan, ID: "other"})
	defer stop()
	sqlite.FreedAll(releaser)
	requireWoken(t, c, "a release-all with a waiter was not heard")
}

// Once a truncated wake file is whole again, a store maps its counts again.
// Until no store waits uncounted (their counts went with the old page) it
// wakes as if someone watched; then releases where nobody waits go back
// to making no write, and a new waiter is counted and woken.
func TestWakeups_CountsBackAfterATruncation(t *testing.T) {
	defer sqlite.RecheckEvery(0)()
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser, waiter := openWake(t, path), openWake(t, path)
	other := domain.ResourceRef{Type: domain.ResourcePlan, ID: "other"}
	c, stop := waiter.Wakeups().Watch(other)
	require.NoError(t, os.Truncate(path+"-wake", 0))
	sqlite.Freed(releaser, wakeRef) // faults, and drops the counts
	require.NoError(t, os.Truncate(path+"-wake", 8192))
	assert.True(t, releaser.Wakeups().Contended(other), "a waiter that lost its count")
	sqlite.Freed(releaser, other)
	requireWoken(t, c, "a waiter that lost its count was not woken")
	stop()

	assert.False(t, releaser.Wakeups().Contended(wakeRef))
	before, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	sqlite.Freed(releaser, wakeRef)
	after, err := os.ReadFile(path + "-wake")
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before[:sqlite.WakeCountsAt], after[:sqlite.WakeCountsAt]), "a release with no waiter wrote after the file was whole again")

	c, stop = waiter.Wakeups().Watch(other)
	defer stop()
	assert.Equal(t, uint32(1), countAt(t, path, sqlite.WakeSlot(other)), "a new waiter is counted")
	sqlite.Freed(releaser, other)
	requireWoken(t, c, "a new waiter was not woken")
}

// A wake file that was replaced and then came back to its path (moved away
// and back) does not keep the flag that sends every release to the path.
func TestWakeups_ReplacedFlagClearedWhenTheFileIsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser := openWake(t, path)
	setCountAt(t, path, 0, 1)
	sqlite.Freed(releaser, wakeRef)
	assert.Zero(t, countAt(t, path, 0), "the flag of a file that is at its path")
}

// Root opening a user's database makes the wake file the database
// owner's, as SQLite does its -wal and -shm: that user's waiters can then
// count themselves, and root's releases wake them.
func TestWakeups_RootMakesTheWakeFileTheOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test gives the database to another user")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "agents.db")
	openWake(t, path).Close()
	require.NoError(t, os.Remove(path+"-wake"))
	require.NoError(t, os.Chown(path, 65534, 65534))
	openWake(t, path)
	fi, err := os.Stat(path + "-wake")
	require.NoError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	assert.Equal(t, uint32(65534), st.Uid, "the wake file's owner")
}

// A truncation that no store faults on (the file grown back before anyone
// touched the page) leaves the counts zero while a store waits: releases
// must not take that zero for nobody.
func TestWakeups_WaiterDuringATruncationNobodyFaultedOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser, waiter := openWake(t, path), openWake(t, path)
	c, stop := waiter.Wakeups().Watch(wakeRef)
	defer stop()
	require.NoError(t, os.Truncate(path+"-wake", 0))
	require.NoError(t, os.Truncate(path+"-wake", 8192))
	assert.True(t, releaser.Wakeups().Contended(wakeRef), "a waiter whose count went with the truncation")
	sqlite.Freed(releaser, wakeRef)
	requireWoken(t, c, "a waiter whose count went with the truncation was not woken")
}

// A store whose count went with a truncation does not take its count off
// the new page: that would hide a waiter counted since.
func TestWakeups_DecrementAfterATruncationKeepsANewCount(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser, before, after := openWake(t, path), openWake(t, path), openWake(t, path)
	_, stop := before.Wakeups().Watch(wakeRef)
	require.NoError(t, os.Truncate(path+"-wake", 0))
	require.NoError(t, os.Truncate(path+"-wake", 8192))
	sqlite.FreedAll(releaser) // nobody else may trust the page yet: it looks
	c, stop2 := after.Wakeups().Watch(wakeRef)
	defer stop2()
	stop() // the earlier waiter gives up
	sqlite.Freed(releaser, wakeRef)
	requireWokenWithin(t, c, 500*time.Millisecond, "a waiter counted after the truncation was hidden by an older waiter's leaving")
}

// The path was looked at when the store opened: the first release after
// it (a CLI's only one) does not look again, which would cost an lstat.
func TestWakeups_FirstReleaseAfterOpenLooksNowhere(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	releaser := openWake(t, path)
	require.NoError(t, os.Rename(path+"-wake", path+"-wake.old"))
	require.NoError(t, os.WriteFile(path+"-wake", nil, 0o600))
	sqlite.Freed(releaser, wakeRef)
	old, err := os.ReadFile(path + "-wake.old")
	require.NoError(t, err)
	assert.Zero(t, binary.NativeEndian.Uint32(old[sqlite.WakeCountsAt:]),
		"the first release after the open looked at the path (and flagged the file it found replaced)")
}
