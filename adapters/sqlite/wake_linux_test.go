//go:build linux

package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
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
