//go:build unix

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/locktest/testclock"
)

// These tests run "locks run" through Main with real commands (sh), and a
// test clock whose timers fire only when the test moves it: the
// keep-alive, a wait's polls and timeout, and the grace period all wait
// on it, so no test sleeps for them. The test waits until the timer it
// means to fire is set (awaitTimer), and pauses the clock to act between
// a move and the timers it makes due. tests/cli runs the same rules through the binary.

// awaitTimer returns once a timer of d is set on clk, passing over the
// others set before it (a renewal's own deadline, say).
func awaitTimer(t *testing.T, clk *testclock.Clock, d time.Duration) {
	t.Helper()
	for clk.NextTimer(t) != d {
	}
}

// awaitTimerBelow returns the duration of the next timer shorter than d
// set on clk: a wait's poll, whose duration is jittered.
func awaitTimerBelow(t *testing.T, clk *testclock.Clock, d time.Duration) time.Duration {
	t.Helper()
	for {
		if got := clk.NextTimer(t); got < d {
			return got
		}
	}
}

// syncBuffer is a buffer that a command's output and agents' messages may
// write at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// stepHarness runs agents commands on a test clock, each in its own
// goroutine if need be, against a database of its own.
type stepHarness struct {
	t   *testing.T
	clk *testclock.Clock
	dir string
	db  string
	env map[string]string
	// sigs receives the channel of each command that catches signals.
	sigs chan chan<- os.Signal
}

func newStepHarness(t *testing.T) *stepHarness {
	dir := t.TempDir()
	db := filepath.Join(dir, "agents.db")
	return &stepHarness{t: t, clk: testclock.New(start), dir: dir, db: db,
		env: map[string]string{"AGENTS_DB": db, "AGENTS_CREATE": "1"}, sigs: make(chan chan<- os.Signal, 16)}
}

// running is a command started by start.
type running struct {
	stdout, stderr syncBuffer
	cancel         context.CancelFunc
	done           chan int
}

func (h *stepHarness) start(args ...string) *running {
	r := &running{done: make(chan int, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	m := &Main{Stdout: &r.stdout, Stderr: &r.stderr, Env: func(k string) string { return h.env[k] }, Clock: h.clk, LocalTime: true, Location: zone,
		Signals: func(c chan<- os.Signal) func() { h.sigs <- c; return func() {} }}
	go func() { r.done <- m.Run(ctx, args) }()
	return r
}

// wait waits for a started command and returns its result.
func (r *running) wait(t *testing.T) result {
	t.Helper()
	select {
	case code := <-r.done:
		r.cancel()
		return result{code: code, stdout: r.stdout.String(), stderr: r.stderr.String()}
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the command did not end", "stderr: %s", r.stderr.String())
		return result{}
	}
}

func (h *stepHarness) run(args ...string) result {
	h.t.Helper()
	return h.start(args...).wait(h.t)
}

func (h *stepHarness) mustRun(args ...string) result {
	h.t.Helper()
	r := h.run(args...)
	require.Equal(h.t, exitOK, r.code, "stderr: %s", r.stderr)
	return r
}

// holder returns the owner of the active lock on plan/id, or "".
func (h *stepHarness) holder(id string) string {
	h.t.Helper()
	var ls []listedLock
	h.mustRun("--json", "locks", "list", "--type", "plan").decode(h.t, &ls)
	for _, l := range ls {
		if l.ResourceID == id {
			return l.OwnerID
		}
	}
	return ""
}

// awaitFile waits until a command has created path, which it does once it
// is ready for what the test does next.
func awaitFile(t *testing.T, path string) {
	t.Helper()
	require.Eventually(t, func() bool { _, err := os.Stat(path); return err == nil }, 10*time.Second, time.Millisecond,
		"the command never created %s", path)
}

// The scripts of the commands that the tests run. Each touches its first
// argument ("$0") once it is ready, which the test awaits.
const (
	// waitForGo runs until its second argument ("$1") exists.
	waitForGo = `touch "$0"; while [ ! -e "$1" ]; do sleep 0.01; done`
	// stopsOnTerm writes "$1" and exits 0 on SIGTERM.
	stopsOnTerm = `trap 'echo TERM > "$1"; exit 0' TERM; touch "$0"; while :; do sleep 0.01; done`
	// ignoresTerm ignores SIGTERM, which the exec'd sleep inherits.
	ignoresTerm = `trap '' TERM; touch "$0"; exec sleep 60`
)

func TestMain_LockRun(t *testing.T) {
	t.Run("EnvironmentStatusAndRelease", func(t *testing.T) {
		h := newStepHarness(t)
		r := h.run("--owner", "alice", "locks", "run", "plan", "p1", "--",
			"sh", "-c", `echo "$AGENTS_LOCK_TOKEN|$AGENTS_LOCK_OWNER|$AGENTS_LOCK_RESOURCE"; exit 7`)
		assert.Equal(t, 7, r.code, "stderr: %s", r.stderr)
		assert.Equal(t, "1|alice|plan/p1\n", r.stdout, "the command's output, and nothing of agents'")
		assert.Empty(t, r.stderr)
		assert.Equal(t, "", h.holder("p1"), "released when the command ended")
	})
	t.Run("KilledBySignalIs128PlusN", func(t *testing.T) {
		h := newStepHarness(t)
		r := h.run("--owner", "alice", "locks", "run", "plan", "p1", "--", "sh", "-c", `kill -KILL $$`)
		assert.Equal(t, 128+9, r.code)
		assert.Equal(t, "", h.holder("p1"))
	})
	t.Run("JSONIsOneDocumentAtTheEnd", func(t *testing.T) {
		h := newStepHarness(t)
		r := h.run("--json", "--owner", "alice", "locks", "run", "plan", "p1", "--ttl", "90s", "--", "sh", "-c", `echo out; kill -TERM $$`)
		assert.Equal(t, 128+15, r.code)
		var doc runDoc
		r.decode(t, &doc)
		assert.Equal(t, lockDoc{Token: 1, OwnerID: "alice", ResourceType: "plan", ResourceID: "p1",
			AcquiredAt: "2026-11-29T19:00:00.000000Z", ExpiresAt: "2026-11-29T19:01:30.000000Z"}, doc.Lock)
		assert.Equal(t, 143, doc.Command.ExitCode)
		require.NotNil(t, doc.Command.Signal)
		assert.Equal(t, 15, *doc.Command.Signal)
		assert.Nil(t, doc.Lost)
		assert.True(t, doc.Released)
		assert.Equal(t, "out\n", r.stderr, "with --json, the command's stdout goes to stderr")
	})
	t.Run("DefaultOwnerIsThisProcess", func(t *testing.T) {
		h := newStepHarness(t)
		r := h.run("locks", "run", "plan", "p1", "--", "sh", "-c", `echo "$AGENTS_LOCK_OWNER"`)
		assert.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
		assert.Contains(t, r.stdout, fmt.Sprintf(":%d:", os.Getpid()))
		h.env["AGENTS_OWNER"] = "env-owner"
		r = h.run("locks", "run", "plan", "p1", "--", "sh", "-c", `echo "$AGENTS_LOCK_OWNER"`)
		assert.Equal(t, "env-owner\n", r.stdout)
	})
	t.Run("ArgumentsAfterDashDashAreTheCommands", func(t *testing.T) {
		h := newStepHarness(t)
		r := h.run("locks", "run", "--owner", "a", "plan", "--ttl", "90s", "--", "-p1", "--",
			"sh", "-c", `echo "$AGENTS_LOCK_RESOURCE $*"`, "sh", "--json", "--ttl", "x", "--")
		assert.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
		assert.Equal(t, "plan/-p1 --json --ttl x --\n", r.stdout)
	})
	t.Run("RenewsAtHalfTheTTL", func(t *testing.T) {
		h := newStepHarness(t)
		ready, goFile := filepath.Join(h.dir, "ready"), filepath.Join(h.dir, "go")
		run := h.start("--owner", "alice", "locks", "run", "plan", "p1", "--ttl", "10s", "--", "sh", "-c", waitForGo, ready, goFile)
		awaitTimer(t, h.clk, 5*time.Second) // the wait for the renewal
		awaitFile(t, ready)
		h.clk.Add(5 * time.Second) // the renewal is due
		// The renewal also sets a 5 s timer (its deadline at the expiry), so
		// wait for its effect rather than for the next timer.
		require.Eventually(t, func() bool { return h.lock("p1").ExpiresAt == start.Add(15*time.Second).Format(jsonTime) },
			10*time.Second, time.Millisecond, "renewed to now+ttl at ttl/2")
		require.NoError(t, os.WriteFile(goFile, nil, 0o600))
		r := run.wait(t)
		assert.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
		assert.Equal(t, "", h.holder("p1"))
	})
	t.Run("LostToAnotherOwnerStopsTheCommand", func(t *testing.T) {
		h := newStepHarness(t)
		ready, term := filepath.Join(h.dir, "ready"), filepath.Join(h.dir, "term")
		run := h.start("--owner", "runner", "locks", "run", "plan", "p1", "--ttl", "10s", "--grace", "3s", "--",
			"sh", "-c", stopsOnTerm, ready, term)
		awaitTimer(t, h.clk, 5*time.Second) // the wait for the renewal
		awaitFile(t, ready)
		// The renewal comes too late: the lock expired, and another owner
		// took it meanwhile (the clock is paused, so the renewal is held
		// back until then).
		h.clk.Pause()
		h.clk.Add(11 * time.Second)
		h.mustRun("--owner", "other", "locks", "acquire", "plan", "p1")
		h.clk.Resume()
		r := run.wait(t)
		assert.Equal(t, exitExpired, r.code)
		assert.Contains(t, r.stderr, `agents locks run: the lock of owner "runner" on plan/p1 (token 1) was lost: owner "other" took it over (token 2)`)
		assert.Contains(t, r.stderr, "SIGTERM now, SIGKILL in 3s if it is still running")
		assert.FileExists(t, term, "the command got SIGTERM")
		assert.Equal(t, "other", h.holder("p1"), "the new holder keeps its lock")
	})
	t.Run("SIGKILLAfterGrace", func(t *testing.T) {
		h := newStepHarness(t)
		ready := filepath.Join(h.dir, "ready")
		run := h.start("--json", "--owner", "runner", "locks", "run", "plan", "p1", "--ttl", "10s", "--grace", "3s", "--",
			"sh", "-c", ignoresTerm, ready)
		awaitTimer(t, h.clk, 5*time.Second) // the wait for the renewal
		awaitFile(t, ready)
		h.mustRun("--owner", "runner", "locks", "release", "plan", "p1") // by hand, behind its back
		h.clk.Add(5 * time.Second)                                       // the renewal is due
		awaitTimer(t, h.clk, 3*time.Second)                              // the grace period
		h.clk.Add(3 * time.Second)
		r := run.wait(t)
		assert.Equal(t, exitExpired, r.code)
		assert.Contains(t, r.stderr, "was still running 3s after SIGTERM: sending SIGKILL")
		var doc runDoc
		r.decode(t, &doc)
		assert.Equal(t, 128+9, doc.Command.ExitCode)
		require.NotNil(t, doc.Lost)
		assert.Equal(t, "removed", doc.Lost.Reason, "released by hand before its expiry")
		assert.Contains(t, doc.Lost.Message, `the lock of owner "runner" on plan/p1 (token 1) was lost`)
		assert.Nil(t, doc.Lost.NewHolder)
		assert.False(t, doc.Released)
	})
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run("Forwards"+strings.ToUpper(sig.String()[:1])+sig.String()[1:], func(t *testing.T) {
			h := newStepHarness(t)
			ready := filepath.Join(h.dir, "ready")
			run := h.start("--owner", "alice", "locks", "run", "plan", "p1", "--", "sh", "-c",
				`trap 'exit 42' INT TERM; touch "$0"; while :; do sleep 0.01; done`, ready)
			sigs := <-h.sigs
			awaitFile(t, ready)
			sigs <- sig
			r := run.wait(t)
			assert.Equal(t, 42, r.code, "the command's status, stderr: %s", r.stderr)
			assert.Equal(t, "", h.holder("p1"), "released once the command has ended")
		})
	}
	t.Run("WaitsForTheLock", func(t *testing.T) {
		h := newStepHarness(t)
		h.mustRun("--owner", "alice", "locks", "acquire", "plan", "p1", "--ttl", "1h")
		run := h.start("--owner", "bob", "locks", "run", "plan", "p1", "--wait", "--", "sh", "-c", `echo "$AGENTS_LOCK_OWNER"`)
		poll := awaitTimerBelow(t, h.clk, time.Second)
		h.mustRun("--owner", "alice", "locks", "release", "plan", "p1")
		h.clk.Add(poll) // the poll is due
		r := run.wait(t)
		assert.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
		assert.Equal(t, "bob\n", r.stdout)
	})
	t.Run("WaitTimeoutRunsNothing", func(t *testing.T) {
		h := newStepHarness(t)
		h.mustRun("--owner", "alice", "locks", "acquire", "plan", "p1", "--ttl", "1h")
		run := h.start("--owner", "bob", "locks", "run", "plan", "p1", "--wait", "--timeout", "30s", "--", "sh", "-c", `echo ran`)
		awaitTimer(t, h.clk, 30*time.Second)   // the timeout
		awaitTimerBelow(t, h.clk, time.Second) // a poll: the waiter has tried once
		h.clk.Add(30 * time.Second)            // the timeout is due (and polls, which find the lock held)
		r := run.wait(t)
		assert.Equal(t, exitConflict, r.code)
		assert.Empty(t, r.stdout)
		assert.Contains(t, r.stderr, `plan/p1 is held by another owner: "alice" (token 1)`)
		assert.Contains(t, r.stderr, "Gave up after waiting 30s (--timeout).")
	})
	t.Run("CommandNotFound", func(t *testing.T) {
		h := newStepHarness(t)
		r := h.run("--json", "--owner", "a", "locks", "run", "plan", "p1", "--", "no-such-command-here")
		assert.Equal(t, exitNotFound, r.code)
		assert.Contains(t, r.stderr, `command not found: "no-such-command-here"`)
		var doc struct{ Error errorDoc }
		r.decode(t, &doc)
		assert.Equal(t, "not_found", doc.Error.Code)
		assert.NoFileExists(t, h.db, "nothing is taken for a command that cannot run")
	})
	t.Run("CommandNotExecutable", func(t *testing.T) {
		h := newStepHarness(t)
		script := filepath.Join(h.dir, "script")
		require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\n"), 0o600))
		r := h.run("--owner", "a", "locks", "run", "plan", "p1", "--", script)
		assert.Equal(t, exitCannotRun, r.code)
		assert.Contains(t, r.stderr, "command cannot be run")
		assert.NoFileExists(t, h.db)
	})
}

func TestMain_AcquireWait(t *testing.T) {
	t.Run("WaitsUntilReleased", func(t *testing.T) {
		h := newStepHarness(t)
		h.mustRun("--owner", "alice", "locks", "acquire", "plan", "p1", "--ttl", "1h")
		run := h.start("--owner", "bob", "locks", "acquire", "plan", "p1", "--wait")
		awaitTimerBelow(t, h.clk, time.Second) // a poll
		h.clk.Pause()                          // the poll fires only once alice has released
		h.clk.Add(2 * time.Second)
		h.mustRun("--owner", "alice", "locks", "release", "plan", "p1")
		h.clk.Resume()
		r := run.wait(t)
		assert.Equal(t, exitOK, r.code, "stderr: %s", r.stderr)
		assert.Contains(t, r.stdout, `Acquired plan/p1 for owner "bob" (token 2).`)
		assert.Equal(t, "bob", h.holder("p1"))
	})
	t.Run("TimeoutIsAConflictWithTheHolder", func(t *testing.T) {
		h := newStepHarness(t)
		h.mustRun("--owner", "alice", "locks", "acquire", "plan", "p1", "--ttl", "1h")
		run := h.start("--json", "--owner", "bob", "locks", "acquire", "plan", "p1", "--wait", "--timeout", "30")
		awaitTimer(t, h.clk, 30*time.Second)   // the timeout
		awaitTimerBelow(t, h.clk, time.Second) // a poll: the waiter has tried once
		h.clk.Add(30 * time.Second)            // the timeout is due (and polls, which find the lock held)
		r := run.wait(t)
		assert.Equal(t, exitConflict, r.code)
		var doc struct{ Error errorDoc }
		r.decode(t, &doc)
		assert.Equal(t, "conflict", doc.Error.Code)
		assert.Contains(t, doc.Error.Message, "after waiting 30s")
		require.NotNil(t, doc.Error.Holder)
		assert.Equal(t, "alice", doc.Error.Holder.OwnerID)
		require.NotNil(t, doc.Error.WaitedSeconds)
		assert.Equal(t, 30.0, *doc.Error.WaitedSeconds)
		assert.Contains(t, r.stderr, `plan/p1 is held by another owner: "alice" (token 1)`)
		assert.Contains(t, r.stderr, "expires   2026-11-29 22:00:00 TST (in 59m30s)")
		assert.Contains(t, r.stderr, "Gave up after waiting 30s (--timeout).")
	})
	t.Run("Interrupted", func(t *testing.T) {
		h := newStepHarness(t)
		h.mustRun("--owner", "alice", "locks", "acquire", "plan", "p1", "--ttl", "1h")
		run := h.start("--owner", "bob", "locks", "acquire", "plan", "p1", "--wait")
		awaitTimerBelow(t, h.clk, time.Second) // a poll
		h.clk.Pause()                          // the poll does not fire: the wait is interrupted, not retried
		h.clk.Add(2 * time.Second)
		run.cancel()
		r := run.wait(t)
		assert.Equal(t, exitConflict, r.code)
		assert.Contains(t, r.stderr, "Interrupted after waiting 2s.")
		assert.Equal(t, "alice", h.holder("p1"))
	})
	t.Run("WithoutWaitJSONHasNoWaited", func(t *testing.T) {
		h := newStepHarness(t)
		h.mustRun("--owner", "alice", "locks", "acquire", "plan", "p1")
		r := h.run("--json", "--owner", "bob", "locks", "acquire", "plan", "p1")
		var doc map[string]map[string]any
		r.decode(t, &doc)
		assertKeysOf(t, doc["error"], "code", "message", "holder")
	})
}

func assertKeysOf(t *testing.T, obj map[string]any, keys ...string) {
	t.Helper()
	got := make([]string, 0, len(obj))
	for k := range obj {
		got = append(got, k)
	}
	assert.ElementsMatch(t, keys, got)
}

// lock reads the lock on plan/id through the CLI.
func (h *stepHarness) lock(id string) lockDoc {
	h.t.Helper()
	var ls []listedLock
	h.mustRun("--json", "locks", "list", "--type", "plan").decode(h.t, &ls)
	for _, l := range ls {
		if l.ResourceID == id {
			return l.lockDoc
		}
	}
	require.Failf(h.t, "no lock", "plan/%s", id)
	return lockDoc{}
}
