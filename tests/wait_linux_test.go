//go:build linux

package tests

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
	"github.com/cleveragents/locks/tests/testdb"
)

// A waiter in one container hears of a release in another container (as
// another process would, through the file beside the database) and takes
// the lock without its clock moving: no poll hands it over.
func TestTake_WokenAcrossContainersOnOneFile(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	clk := testclock.New(newMock().Now())
	procA := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: clk})
	procB := MustOpen(t, locks.Config{Database: db, Owner: "B", Clock: clk})

	held, err := procA.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	type result struct {
		h   *application.Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := procB.Locks.Take(ctx, "B", plan1, application.AcquireOptions{Wait: true})
		done <- result{h, err}
	}()
	d := clk.NextTimer(t) // B sleeps, watching
	assert.LessOrEqual(t, d, time.Second, "a watching waiter still reads the store at least once a second")
	_, err = held.Release(ctx)
	require.NoError(t, err)
	var r result
	select {
	case r = <-done: // the clock never moves in this test
	case <-time.After(time.Minute):
		t.Fatal("the waiter was not woken by the release in the other container")
	}
	require.NoError(t, r.err)
	assert.Equal(t, "B", r.h.Lock().Owner)
	assert.Greater(t, r.h.Lock().Token, held.Lock().Token)
	_, err = r.h.Release(ctx)
	require.NoError(t, err)
}

// Two waiting containers of one process on one file are both woken by
// the releases in a third: they watch one file, for which the process's
// one inotify instance has one watch, and each must hear it.
func TestTake_TwoContainersOnOneFileBothWoken(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	holder := MustOpen(t, locks.Config{Database: db, Owner: "A"})
	refs := []domain.ResourceRef{plan1, plan2}
	var held []*application.Handle
	for _, ref := range refs {
		h, err := holder.Locks.Take(ctx, "A", ref, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		held = append(held, h)
	}
	done := make(chan error, len(refs))
	for i, ref := range refs {
		clk := testclock.New(newMock().Now())
		owner := fmt.Sprintf("W%d", i)
		waiter := MustOpen(t, locks.Config{Database: db, Owner: owner, Clock: clk})
		go func() {
			h, err := waiter.Locks.Take(ctx, owner, ref, application.AcquireOptions{Wait: true})
			if err == nil {
				_, err = h.Release(ctx)
			}
			done <- err
		}()
		clk.NextTimer(t) // it sleeps, watching; its clock never moves
	}
	for _, h := range held {
		_, err := h.Release(ctx)
		require.NoError(t, err)
	}
	for range refs {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("a waiting container was not woken by the release in the other container")
		}
	}
}

// A release that sends no wake-up (a program that deletes the row itself)
// is still found, at the waiter's next read on its own clock.
func TestTake_ReleaseWithoutWakeupFoundByTheFallbackRead(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	clk := testclock.New(newMock().Now())
	procA := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: clk})
	procB := MustOpen(t, locks.Config{Database: db, Owner: "B", Clock: clk})
	_, err := procA.Locks.Acquire(ctx, "A", plan1, time.Hour)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		h, err := procB.Locks.Take(ctx, "B", plan1, application.AcquireOptions{Wait: true})
		if err == nil {
			_, err = h.Release(ctx)
		}
		done <- err
	}()
	d := clk.NextTimer(t)
	deleteRow(t, db, plan1)
	select {
	case err := <-done:
		t.Fatalf("taken before the waiter read the store again (err %v): the delete sent a wake-up?", err)
	default:
	}
	clk.Add(d)
	require.NoError(t, <-done)
}

// deleteRow removes the lock on ref as a program other than the module
// would: through its own connection, with no wake-up.
func deleteRow(t *testing.T, db string, ref domain.ResourceRef) {
	t.Helper()
	sdb, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	defer sdb.Close()
	res, err := sdb.Exec(`DELETE FROM locks WHERE resource_type = ? AND resource_id = ?`, string(ref.Type), ref.ID)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// A release in this process wakes a waiter in another process, whose
// clock never moves: only the wake-up can hand the lock over. On SQLite
// the wake-up goes through the file beside the database, on PostgreSQL
// through the server.
func TestTake_ReleaseWakesWaitingProcess(t *testing.T) {
	ctx := context.Background()
	t.Run("SQLite", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "agents.db")
		probe, err := sqlite.Open(ctx, db, sqlite.Options{})
		require.NoError(t, err)
		defer probe.Close()
		releaseWakesWaitingProcess(t, db, probe.Wakeups())
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		db := testdb.Postgres(t)
		probe, err := postgres.Open(ctx, db, postgres.Options{})
		require.NoError(t, err)
		defer probe.Close()
		releaseWakesWaitingProcess(t, db, probe.Wakeups())
	})
}

// releaseWakesWaitingProcess holds plan1 on db, starts a process that
// waits for it and, once probe (a second store on db) says that another
// process waits, releases, so that the release comes while the worker
// sleeps.
func releaseWakesWaitingProcess(t *testing.T, db string, probe application.Wakeups) {
	ctx := context.Background()
	holder := MustOpen(t, locks.Config{Database: db, Owner: "A"})
	held, err := holder.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)

	cmd := startWorker(t, "wait", envDB+"="+db, envOwner+"=B")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	require.Eventually(t, func() bool { return probe.Contended(plan1) },
		time.Minute, time.Millisecond, "the waiting process never watched plan1")
	_, err = held.Release(ctx)
	require.NoError(t, err)

	line := make(chan []byte, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Bytes()
	}()
	var got domain.Lock
	select {
	case b := <-line:
		require.NoError(t, json.Unmarshal(b, &got), "the waiting process printed %q", b)
	case <-time.After(time.Minute):
		t.Fatal("the waiting process was not woken by the release")
	}
	assert.Equal(t, "B", got.Owner)
	assert.Greater(t, got.Token, held.Lock().Token)
	require.NoError(t, cmd.Wait())
}
