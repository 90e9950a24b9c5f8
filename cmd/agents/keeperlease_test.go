//go:build linux

package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startMember starts a group and a member of it that runs script; the
// group's heartbeat is beat (zero: a silent agents).
func startMember(t *testing.T, beat time.Duration, script string) (*group, *child) {
	t.Helper()
	g, err := startGroup(nil)
	require.NoError(t, err)
	g.beat = beat
	p, err := startChild(exec.Command("sh", "-c", script), g)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = p.kill()
		g.close()
	})
	return g, p
}

// ended waits for the member, at most 30 s (a hang, not a speed goal),
// and returns the signal that killed it.
func ended(t *testing.T, p *child) syscall.Signal {
	t.Helper()
	select {
	case err := <-p.done:
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "the member exited by itself: %v", err)
		ws := exit.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled(), "the member exited by itself: %v", err)
		return ws.Signal()
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the member still runs")
		return 0
	}
}

// A silent agents (stopped: no beat, no renewal) loses the lead: the
// keeper stops the group a fifth of the TTL before the expiry (here 1 s
// before an expiry 2 s away), SIGTERM then SIGKILL after the grace, and
// says so. It stays, to guard the group, until agents is done.
func TestKeeper_StopsTheGroupOfASilentAgents(t *testing.T) {
	g, p := startMember(t, 0, `trap '' TERM; exec sleep 60`)
	start := time.Now()
	g.lease(func() time.Duration { return 2 * time.Second }, 5*time.Second, 300*time.Millisecond)
	assert.Equal(t, syscall.SIGKILL, ended(t, p), "SIGTERM is ignored: SIGKILL after the grace")
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, time.Second+300*time.Millisecond, "stopped before the lead and the grace had passed")
	select {
	case <-g.lapsedc():
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper did not say it stopped the group")
	}
	select {
	case <-g.guard:
		t.Fatalf("the keeper is gone (%s): it must outlive the group it stopped", g.guardWhy)
	default:
	}
}

// A grace longer than the lead ends at the expiry when agents is silent:
// the lock cannot be renewed, and another owner may take it then, so what
// ignores SIGTERM is killed by the expiry, not a whole --grace after the
// keeper's SIGTERM (an outside review saw a second command run for 30 s
// beside the first).
func TestKeeper_SilentAgentsGraceEndsAtTheExpiry(t *testing.T) {
	g, p := startMember(t, 0, `trap '' TERM; exec sleep 60`)
	start := time.Now()
	g.lease(func() time.Duration { return 2 * time.Second }, 5*time.Second, 30*time.Second)
	assert.Equal(t, syscall.SIGKILL, ended(t, p), "SIGTERM is ignored: SIGKILL")
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, time.Second, "killed before the lead")
	assert.Less(t, took, 2*time.Second+1500*time.Millisecond, "killed by the expiry (2 s), not --grace after the SIGTERM")
	select {
	case <-g.lapsedc():
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper did not say it stopped the group")
	}
	// What agents then says: the SIGKILL came a margin before the
	// expiry, about 1 s after the SIGTERM, not --grace (30 s) later.
	assert.Less(t, g.keeperKillIn(30*time.Second), 2*time.Second, "the keeper says when it kills")
}

// A live agents beats: while its renewals come, nothing is stopped; once
// they stop, the keeper waits for the expiry itself (the keep-alive of a
// live agents retries a failing store until then), never for less.
func TestKeeper_WaitsForTheExpiryOfABeatingAgents(t *testing.T) {
	g, p := startMember(t, heartbeat, `exec sleep 60`)
	for range 8 { // renewals, each 3 s from the expiry, for more than the lead (1 s) and the beat window
		g.lease(func() time.Duration { return 3 * time.Second }, 5*time.Second, 0)
		time.Sleep(300 * time.Millisecond)
	}
	select {
	case err := <-p.done:
		t.Fatalf("the member was stopped while the lease was renewed: %v", err)
	default:
	}
	last := time.Now()
	g.lease(func() time.Duration { return 1500 * time.Millisecond }, 5*time.Second, 0)
	assert.Equal(t, syscall.SIGTERM, ended(t, p))
	assert.GreaterOrEqual(t, time.Since(last), 1500*time.Millisecond, "stopped before the expiry, though agents beat")
}

// A keeper that stops the group while the lock is still held (here: the
// test's clock never moves, so the lock never expires on it, while the
// keeper's real clock passes the expiry) is reported as renewal_late:
// exit 4, and the lock is released, as after keeper_gone. It takes the
// 5 s of the shortest TTL, on the keeper's clock.
func TestMain_LockRunKeeperStopsAHeldLock(t *testing.T) {
	h := newStepHarness(t)
	ready, term := filepath.Join(h.dir, "ready"), filepath.Join(h.dir, "term")
	run := h.start("--json", "--owner", "runner", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "1s", "--",
		"sh", "-c", stopsOnTerm, ready, term)
	awaitTimer(t, h.clk, 2500*time.Millisecond) // the renewal, which never comes
	awaitFile(t, ready)
	r := run.wait(t)
	assert.Equal(t, exitExpired, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, "heard of no renewal of the lock before its expiry")
	assert.FileExists(t, term, "the command got SIGTERM")
	var doc runDoc
	r.decode(t, &doc)
	require.NotNil(t, doc.Lost)
	assert.Equal(t, "renewal_late", doc.Lost.Reason)
	assert.True(t, doc.Released, "the lock, still held, is released")
	assert.Equal(t, "", h.holder("p1"))
}
