package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// promptLossTTL is the holder's TTL: its renewal, at TTL/2, would find
// the loss 10 s late; the wake-up must beat it by far.
const promptLossTTL = 20 * time.Second

// promptLossBound is how soon after the takeover the holder's work
// context must have ended (issue 39).
const promptLossBound = 200 * time.Millisecond

// lossReport is what a holdDo worker prints once its work's context ended.
type lossReport struct {
	EndedUnixNano int64  `json:"ended_unix_nano"`
	Reason        string `json:"reason"` // the LockLostError's, "" if the cause is none
	Cause         string `json:"cause"`
}

// workerHoldDo holds plan1 in Do (promptLossTTL, the real clock), prints
// the lock, and once the work's context ends prints a lossReport.
func workerHoldDo() int {
	ctx := context.Background()
	owner := os.Getenv(envOwner)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: owner})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer c.Close()
	err = c.Locks.Do(ctx, owner, plan1, application.AcquireOptions{TTL: promptLossTTL}, func(ctx context.Context, l domain.Lock) error {
		if reportJSON(l) != 0 {
			return errors.New("could not report the lock")
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
			return errors.New("the work's context did not end within a minute")
		}
		r := lossReport{EndedUnixNano: time.Now().UnixNano(), Cause: fmt.Sprint(context.Cause(ctx))}
		var lost *domain.LockLostError
		if errors.As(context.Cause(ctx), &lost) {
			r.Reason = lost.Reason.String()
		}
		reportJSON(r)
		return nil
	})
	if lost := (*domain.LockLostError)(nil); err != nil && !errors.As(err, &lost) {
		fmt.Fprintln(os.Stderr, "do:", err)
		return 1
	}
	return 0
}

// A holder in Do in one process, its lock removed and taken by another
// owner in another process while it holds, sees its work's context end
// within promptLossBound of the takeover, long before its renewal: on
// SQLite through the wake file, on PostgreSQL through a notification.
func TestDo_LossHeardAcrossProcesses(t *testing.T) {
	stores := []struct {
		name  string
		db    func(t *testing.T) string
		probe func(t *testing.T, db string) application.Wakeups
	}{
		{"SQLite", func(t *testing.T) string {
			if runtime.GOOS != "linux" {
				t.Skip("no wake file here (it needs inotify): the holder learns at its renewal")
			}
			return filepath.Join(t.TempDir(), "agents.db")
		}, func(t *testing.T, db string) application.Wakeups {
			p, err := sqlite.Open(context.Background(), db, sqlite.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { p.Close() })
			return p.Wakeups()
		}},
		{"PostgreSQL", func(t *testing.T) string { return testdb.Postgres(t) }, func(t *testing.T, db string) application.Wakeups {
			p, err := postgres.Open(context.Background(), db, postgres.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { p.Close() })
			return p.Wakeups()
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Run("RemovedAndTaken", func(t *testing.T) {
				db := st.db(t)
				lossHeard(t, db, st.probe, nil, func(ctx context.Context, c *locks.Container) error {
					// As `agents locks release --owner A` and then another owner would.
					if ok, err := c.Locks.Release(ctx, "A", plan1); err != nil || !ok {
						return fmt.Errorf("the removal removed nothing (%v)", err)
					}
					_, err := c.Locks.Acquire(ctx, "B", plan1, promptLossTTL)
					return err
				}, "removed", "taken over")
			})
			t.Run("TakenOverByAClockAhead", func(t *testing.T) {
				// A clock an hour ahead finds the lock expired and replaces
				// it, with no release: the takeover itself must be heard.
				ahead := clock.NewMock()
				ahead.Set(time.Now().Add(time.Hour))
				db := st.db(t)
				lossHeard(t, db, st.probe, ahead, func(ctx context.Context, c *locks.Container) error {
					h, err := c.Locks.Take(ctx, "B", plan1, application.AcquireOptions{TTL: promptLossTTL})
					if err == nil && h.Lock().Owner != "B" {
						err = fmt.Errorf("taken by %q", h.Lock().Owner)
					}
					return err
				}, "taken over")
			})
		})
	}
}

// lossHeard starts a holdDo worker on db, runs takeover in this process
// (on clk, nil: the real clock) once it holds, and checks that the
// worker's work ended within promptLossBound of it, for one of reasons.
func lossHeard(t *testing.T, db string, probe func(*testing.T, string) application.Wakeups, clk application.Clock,
	takeover func(context.Context, *locks.Container) error, reasons ...string) {
	ctx := context.Background()
	c := MustOpen(t, locks.Config{Database: db, Owner: "B", Clock: clk}) // creates and migrates db
	watches := probe(t, db)
	cmd := startWorker(t, "holdDo", envDB+"="+db, envOwner+"=A")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	lines := make(chan []byte, 2)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(lines)
	}()
	next := func(what string) []byte {
		t.Helper()
		select {
		case b, ok := <-lines:
			require.True(t, ok, "the worker exited before it printed %s", what)
			return b
		case <-time.After(time.Minute):
			t.Fatalf("the worker did not print %s within a minute", what)
			return nil
		}
	}
	var held domain.Lock
	require.NoError(t, json.Unmarshal(next("its lock"), &held))
	require.Equal(t, "A", held.Owner)
	// The holder's watch is in force once another store sees it (on
	// PostgreSQL it takes a lock, then announces it); a takeover before
	// that is found by the read the watch's start makes, not measured here.
	assert.Eventually(t, func() bool { return watches.Contended(plan1) }, 5*time.Second, time.Millisecond,
		"the holder does not watch its resource")

	before := time.Now()
	require.NoError(t, takeover(ctx, c))
	took := time.Now()
	var r lossReport
	require.NoError(t, json.Unmarshal(next("the end of its work"), &r))
	ended := time.Unix(0, r.EndedUnixNano)
	t.Logf("the holder's work ended %s after the takeover returned (%s after it began); cause: %s",
		ended.Sub(took), ended.Sub(before), r.Cause)
	assert.True(t, ended.After(before), "the work ended before the takeover began: %s", r.Cause)
	assert.Less(t, ended.Sub(took), promptLossBound, "the holder learned of its loss too late")
	assert.Contains(t, reasons, r.Reason, "the cause: %s", r.Cause)
	require.NoError(t, cmd.Wait())
}
