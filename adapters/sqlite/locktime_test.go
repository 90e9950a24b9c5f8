package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

// A clock that panics while the lone INSERT asks it the time panics in
// the caller, and leaves the store, and the file, writable: the statement
// is aborted, not unwound through SQLite with its write lock held.
func TestLockTime_PanicInClockLeavesStoreWritable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	require.NoError(t, err)
	defer db.Close()
	repo := sqlite.NewLockRepository(db)
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	plan := func(id string) domain.ResourceRef { return domain.ResourceRef{Type: domain.ResourcePlan, ID: id} }

	func() {
		defer func() { assert.Equal(t, "clock failed", recover(), "the clock's panic, in the caller") }()
		_, _ = repo.AcquireAt(t.Context(), plan("p1"), "alice",
			func() (time.Time, time.Time) { panic("clock failed") })
	}()

	// Another process on the file can still write.
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(1000)")
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Exec("BEGIN IMMEDIATE; ROLLBACK")
	require.NoError(t, err, "another process takes the write lock after the panic")

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	out, err := repo.AcquireAt(ctx, plan("p2"), "bob",
		func() (time.Time, time.Time) { return now, now.Add(time.Minute) })
	require.NoError(t, err, "the store writes again after a panic in the clock")
	require.Equal(t, "bob", out.Lock.Owner)
}

// Another SQL caller in the process gets an error, never a time, from
// cleveragents_locks_time, even while an insert waits with its key: the
// keys cannot be guessed, and a call by another would date it early.
func TestLockTime_OtherCallerCannotReadAnInsertsTime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	require.NoError(t, err)
	defer db.Close()
	repo := sqlite.NewLockRepository(db)

	// Another connection holds SQLite's write lock.
	other, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	require.NoError(t, err)
	defer other.Close()
	tx, err := other.Begin()
	require.NoError(t, err)
	_, err = tx.Exec("UPDATE locks SET owner_id = owner_id")
	require.NoError(t, err)

	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var current = make(chan time.Time, 1)
	current <- clock
	at := func() (time.Time, time.Time) {
		n := <-current
		current <- n
		return n, n.Add(5 * time.Second)
	}
	type result struct {
		l   domain.Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := repo.AcquireAt(context.Background(), domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, "alice", at)
		done <- result{out.Lock, err}
	}()
	time.Sleep(200 * time.Millisecond) // the insert waits in SQLite's busy handler

	// An unrelated connection of the embedder, on another file.
	mine, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "mine.db"))
	require.NoError(t, err)
	defer mine.Close()
	var got string
	for k := 1; k <= 2000 && got == ""; k++ { // well within the busy timeout, also under -race
		_ = mine.QueryRow("SELECT cleveragents_locks_time(?, 0, 0)", k).Scan(&got)
	}
	// The writer kept the lock longer than the TTL.
	<-current
	current <- clock.Add(6 * time.Second)
	require.NoError(t, tx.Commit())
	r := <-done
	require.NoError(t, r.err)
	assert.Empty(t, got, "another caller got a time from cleveragents_locks_time")
	assert.True(t, r.l.ExpiresAt.After(clock.Add(6*time.Second)), "lock expires %s, written at %s", r.l.ExpiresAt, clock.Add(6*time.Second))
}
