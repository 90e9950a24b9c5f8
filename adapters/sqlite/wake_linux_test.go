//go:build linux

package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

var wakeRef = domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}

func openWake(t *testing.T, path string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NotNil(t, db.Wakeups(), "no wake-ups on Linux")
	return db
}

func requireWoken(t *testing.T, c <-chan struct{}, why string) {
	t.Helper()
	require.NotNil(t, c, "the watch was refused")
	select {
	case <-c:
	case <-time.After(time.Minute):
		t.Fatal(why)
	}
}

// Two stores on one file stand for two processes: a release through one
// wakes a watcher of the other, and a watcher makes the resource
// contended for the other, not for itself.
func TestWakeups_BetweenStoresOnOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	waiter, releaser := openWake(t, path), openWake(t, path)
	c, stop := waiter.Wakeups().Watch(wakeRef)
	assert.True(t, releaser.Wakeups().Contended(wakeRef))
	assert.False(t, waiter.Wakeups().Contended(wakeRef), "its own watch")
	sqlite.Freed(releaser, wakeRef)
	requireWoken(t, c, "the release was not heard")
	stop()
	assert.False(t, releaser.Wakeups().Contended(wakeRef), "still contended after the watch stopped")
}

// Someone removes the wake file while the stores stay open: a later wait
// hears later releases again, whether the releaser opened the file before
// the removal (and keeps running) or after it, and the releaser sees the
// waiter's mark.
func TestWakeups_WakeFileRemoved(t *testing.T) {
	for _, late := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "agents.db")
		waiter := openWake(t, path)
		var releaser *sqlite.DB
		if !late {
			releaser = openWake(t, path)
		}
		_, stop := waiter.Wakeups().Watch(wakeRef) // a first wait, over
		stop()
		require.NoError(t, os.Remove(path+"-wake"))
		if late {
			releaser = openWake(t, path)
		}

		c, stop := waiter.Wakeups().Watch(wakeRef) // a new wait
		assert.True(t, releaser.Wakeups().Contended(wakeRef), "late releaser %v: the waiter's mark is on a removed file", late)
		sqlite.Freed(releaser, wakeRef)
		requireWoken(t, c, "a release after the wake file's removal was not heard")
		stop()
	}
}

// inotifyInstances counts this process's inotify instances.
func inotifyInstances(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// Stores that waited and stopped waiting keep no inotify instance: each
// user has few (128 by default), and a store that keeps one after its wait
// takes it from every other program of the user. The next wait watches
// again.
func TestWakeups_InotifyReleasedAfterWait(t *testing.T) {
	before := inotifyInstances(t)
	dir := t.TempDir()
	dbs := make([]*sqlite.DB, 20)
	for i := range dbs {
		dbs[i] = openWake(t, filepath.Join(dir, "agents.db"))
		c, stop := dbs[i].Wakeups().Watch(wakeRef)
		require.NotNil(t, c)
		stop()
	}
	assert.Equal(t, before, inotifyInstances(t), "inotify instances left open by stores that no longer wait")

	c, stop := dbs[0].Wakeups().Watch(wakeRef)
	defer stop()
	assert.Equal(t, before+1, inotifyInstances(t), "a wait watches again")
	sqlite.Freed(dbs[1], wakeRef)
	requireWoken(t, c, "a release was not heard by a watch started again")
}

// drain takes a pending wake-up off c, if any.
func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// A watch that is on when its wake file is removed or replaced moves to
// the new file at once: the releases go there, and a waiter left on the
// old one would read only on its fallback, once a second, until it
// released or waited again. Two releases in a row must be heard: the move
// itself wakes the watcher once.
func TestWakeups_WatchMovesToReplacedFile(t *testing.T) {
	for _, how := range []string{"Removed", "RenamedOver"} {
		for _, late := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/LateReleaser=%v", how, late), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "agents.db")
				waiter := openWake(t, path)
				var releaser *sqlite.DB
				if !late {
					releaser = openWake(t, path)
				}
				c, stop := waiter.Wakeups().Watch(wakeRef) // a wait that goes on
				defer stop()
				switch how {
				case "Removed":
					require.NoError(t, os.Remove(path+"-wake"))
				case "RenamedOver":
					require.NoError(t, os.WriteFile(path+"-new", nil, 0o600))
					require.NoError(t, os.Rename(path+"-new", path+"-wake"))
				}
				if late {
					releaser = openWake(t, path)
				}
				for i := range 2 {
					drain(c)
					sqlite.Freed(releaser, wakeRef)
					requireWokenWithin(t, c, 10*time.Second, fmt.Sprintf("release %d after the wake file was %s was not heard", i+1, how))
				}
			})
		}
	}
}

// requireWokenWithin is requireWoken with a bound of its own.
func requireWokenWithin(t *testing.T, c <-chan struct{}, d time.Duration, why string) {
	t.Helper()
	require.NotNil(t, c, "the watch was refused")
	select {
	case <-c:
	case <-time.After(d):
		t.Fatal(why)
	}
}

// A database named through a symbolic link to it, or to its directory,
// or by a relative path before a chdir, shares its wake-ups with the
// processes that name it otherwise: the side files are the real name's,
// and a chdir moves nothing. No watch here has a fallback: a wake-up that
// comes is a release heard.
func TestWakeups_OtherNamesOfOneDatabase(t *testing.T) {
	cases := map[string]func(t *testing.T, real string) string{
		"SymlinkToFile": func(t *testing.T, real string) string {
			link := filepath.Join(t.TempDir(), "link.db")
			require.NoError(t, os.Symlink(real, link))
			return link
		},
		"SymlinkToDirectory": func(t *testing.T, real string) string {
			link := filepath.Join(t.TempDir(), "dir")
			require.NoError(t, os.Symlink(filepath.Dir(real), link))
			return filepath.Join(link, filepath.Base(real))
		},
		"RelativeThenChdir": func(t *testing.T, real string) string {
			t.Chdir(filepath.Dir(real))
			return filepath.Base(real)
		},
	}
	for name, otherName := range cases {
		t.Run(name, func(t *testing.T) {
			real := filepath.Join(t.TempDir(), "agents.db")
			releaser := openWake(t, real)
			waiter := openWake(t, otherName(t, real))
			elsewhere := t.TempDir()
			t.Chdir(elsewhere)

			c, stop := waiter.Wakeups().Watch(wakeRef)
			defer stop()
			assert.True(t, releaser.Wakeups().Contended(wakeRef), "the waiter's mark is on another file")
			for i := range 2 {
				drain(c)
				sqlite.Freed(releaser, wakeRef)
				requireWokenWithin(t, c, 10*time.Second, fmt.Sprintf("release %d through the real name was not heard", i+1))
			}
			entries, err := os.ReadDir(elsewhere)
			require.NoError(t, err)
			assert.Empty(t, entries, "files appeared in the directory the process moved to")
		})
	}
}

// After a chdir, every connection of a store opened by a relative path
// still reads the one database: connections are opened as they are
// needed, and one opened by the relative name would find, or create,
// another file.
func TestOpen_RelativePathThenChdir(t *testing.T) {
	for _, readOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("ReadOnly=%v", readOnly), func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			db := openWake(t, "agents.db")
			if readOnly {
				ro, err := sqlite.OpenReadOnly(context.Background(), "agents.db", sqlite.Options{})
				require.NoError(t, err)
				t.Cleanup(func() { ro.Close() })
				db = ro
			}
			elsewhere := t.TempDir()
			t.Chdir(elsewhere)
			readsOneDatabase(t, db, elsewhere)
		})
	}
}

func readsOneDatabase(t *testing.T, db *sqlite.DB, elsewhere string) {
	errs := make(chan error)
	for range 16 { // more than the readers kept open: new connections
		go func() {
			st, err := db.Schema(context.Background())
			if err == nil && !st.MigrationApplied {
				err = fmt.Errorf("a connection reads a database without the lock table")
			}
			errs <- err
		}()
	}
	for range 16 {
		assert.NoError(t, <-errs)
	}
	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	assert.Empty(t, entries, "files appeared in the directory the process moved to")
}

// All the stores of a process share one inotify instance: each user has
// few (fs.inotify.max_user_instances, 128 by default), and 200 stores
// waiting at once with one each took them all, so that every other
// program of the user failed to watch anything (and the last stores'
// waiters polled). Every waiter is still woken by its release, and no
// instance is left once the waits end.
func TestWakeups_OneInotifyInstanceForAllStores(t *testing.T) {
	const stores = 200
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC)
	if err != nil {
		t.Skipf("other programs of this user hold all its inotify instances: %v", err)
	}
	syscall.Close(fd)
	before := inotifyInstances(t)
	dir := t.TempDir()
	dbs := make([]*sqlite.DB, stores)
	for i := range dbs {
		dbs[i] = openWake(t, filepath.Join(dir, fmt.Sprintf("agents%d.db", i)))
	}
	cs := make([]<-chan struct{}, stores)
	stops := make([]func(), stores)
	refused := 0
	for i, db := range dbs {
		cs[i], stops[i] = db.Wakeups().Watch(wakeRef)
		t.Cleanup(stops[i]) // before the stores close, should the test stop early
		if cs[i] == nil {
			refused++
		}
	}
	assert.LessOrEqual(t, inotifyInstances(t)-before, 1, "inotify instances held by %d waiting stores", stores)
	require.Zero(t, refused, "watches refused: their waiters poll")
	for i, db := range dbs {
		sqlite.Freed(db, wakeRef)
		requireWokenWithin(t, cs[i], 10*time.Second, fmt.Sprintf("store %d: its release was not heard", i))
	}
	for _, stop := range stops {
		stop()
	}
	assert.Equal(t, before, inotifyInstances(t), "inotify instances left open after the waits ended")
}

// Stores of one process on one file watch one inode, for which inotify
// gives one watch: a release wakes every store that watches, and a store
// that stops watching does not stop the others' watch, nor does one that
// closes.
func TestWakeups_StoresOfOneProcessOnOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	a, b, c := openWake(t, path), openWake(t, path), openWake(t, path)
	releaser := openWake(t, path)
	ca, stopA := a.Wakeups().Watch(wakeRef)
	defer stopA()
	cb, stopB := b.Wakeups().Watch(wakeRef)
	defer stopB()
	cc, stopC := c.Wakeups().Watch(wakeRef)
	sqlite.Freed(releaser, wakeRef)
	requireWokenWithin(t, ca, 10*time.Second, "the first store's watch was not woken")
	requireWokenWithin(t, cb, 10*time.Second, "the second store's watch was not woken")
	requireWokenWithin(t, cc, 10*time.Second, "the third store's watch was not woken")

	stopC()
	require.NoError(t, c.Close())
	for i := range 2 {
		drain(ca)
		drain(cb)
		sqlite.Freed(releaser, wakeRef)
		requireWokenWithin(t, ca, 10*time.Second, fmt.Sprintf("release %d after another store stopped: the first store's watch was not woken", i+1))
		requireWokenWithin(t, cb, 10*time.Second, fmt.Sprintf("release %d after another store stopped: the second store's watch was not woken", i+1))
	}

	// The file is replaced while both watch it: both move to the new one.
	require.NoError(t, os.WriteFile(path+"-new", nil, 0o600))
	require.NoError(t, os.Rename(path+"-new", path+"-wake"))
	for i := range 2 {
		drain(ca)
		drain(cb)
		sqlite.Freed(releaser, wakeRef)
		requireWokenWithin(t, ca, 10*time.Second, fmt.Sprintf("release %d after the file was replaced: the first store's watch was not woken", i+1))
		requireWokenWithin(t, cb, 10*time.Second, fmt.Sprintf("release %d after the file was replaced: the second store's watch was not woken", i+1))
	}
}

// Where the process can have no inotify instance at all (the user's are
// all taken by other programs), a watch is refused, so that the waiter
// polls, and marks nothing; once an instance can be had again, the next
// watch is on and hears releases.
func TestWakeups_NoInotifyInstanceLeft(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	waiter, releaser := openWake(t, path), openWake(t, path)
	restore := sqlite.FailInotifyInit(syscall.EMFILE)
	c, stop := waiter.Wakeups().Watch(wakeRef)
	assert.False(t, releaser.Wakeups().Contended(wakeRef), "a refused watch marked the resource as waited for")
	stop()
	restore()
	assert.Nil(t, c, "a watch without an inotify instance was not refused: its waiter would never be woken")

	c, stop = waiter.Wakeups().Watch(wakeRef)
	defer stop()
	sqlite.Freed(releaser, wakeRef)
	requireWokenWithin(t, c, 10*time.Second, "a watch once an instance could be had again did not hear the release")
}

// A takeover replaces a lock that its holder may still think its own
// (its process paused, or its clock behind): the holder's watch in
// another process hears it, as it hears a release; an acquisition of
// a free resource sends nothing.
func TestWakeups_TakeoverWakesTheHoldersWatch(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	holder, taker := openWake(t, path), openWake(t, path)
	c, stop := holder.Wakeups().Watch(wakeRef)
	defer stop()
	repo := sqlite.NewLockRepository(taker)
	now := time.Now().UTC().Truncate(time.Microsecond)
	insert := func(owner string, acquired time.Time) application.Decide {
		return func(*domain.Lock) (application.Change, error) {
			return application.Change{Kind: application.ChangeInsert,
				Lock: domain.Lock{Owner: owner, AcquiredAt: acquired, ExpiresAt: acquired.Add(time.Minute)}}, nil
		}
	}
	_, err := repo.Update(ctx, wakeRef, insert("A", now.Add(-2*time.Minute))) // expired a minute ago
	require.NoError(t, err)
	select {
	case <-c:
		t.Fatal("an acquisition of a free resource woke a watcher")
	default:
	}
	taken, err := repo.Update(ctx, wakeRef, insert("B", now))
	require.NoError(t, err)
	require.Equal(t, "B", taken.Owner)
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal("a takeover did not wake the holder's watch in the other store")
	}
}
