//go:build linux

package tests

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
)

// fifoSkipBound is how soon a waiter that died at the head of the queue
// must be skipped: its death wakes nobody, so the next waiter finds it on
// its fallback read (once a second, jittered), plus a loaded machine's slack.
const fifoSkipBound = 3 * time.Second

// A waiter that died (SIGKILL) while first in the queue is skipped within
// about a second, and one that gave up (its context ended) at once: the
// next live waiter is granted, in order.
func TestFIFO_DeadOrGoneWaiterSkipped(t *testing.T) {
	for _, st := range fifoStores {
		t.Run(st.name, func(t *testing.T) {
			db := st.db(t)
			ctx := context.Background()
			c := MustOpen(t, locks.Config{Database: db, Owner: "holder"})
			h, err := c.Locks.Take(ctx, "holder", plan1, application.AcquireOptions{TTL: time.Minute})
			require.NoError(t, err)
			dead := startFIFO(t, db, "dead")
			time.Sleep(fifoGap)
			gone := startFIFO(t, db, "gone")
			time.Sleep(fifoGap)
			next := startFIFO(t, db, "next")
			time.Sleep(fifoGap)
			last := startFIFO(t, db, "last")
			time.Sleep(fifoGap)

			// The head is paused as the lock comes free: it keeps its
			// place, so nobody is granted; then it dies.
			require.NoError(t, dead.cmd.Process.Signal(syscall.SIGSTOP))
			require.Eventually(t, func() bool { return stopped(dead.cmd.Process.Pid) }, time.Minute, time.Millisecond,
				"the paused waiter did not stop")
			_, err = h.Release(ctx)
			require.NoError(t, err)
			_, err = io.WriteString(gone.stdin, "quit\n")
			require.NoError(t, err)
			require.Equal(t, "gave up", gone.next(t).Event)
			select {
			case e := <-next.events:
				t.Fatalf("a waiter was granted while an earlier one, paused, still waited: %+v", e)
			case <-time.After(500 * time.Millisecond):
			}
			killed := time.Now()
			require.NoError(t, dead.cmd.Process.Kill())

			e := next.next(t)
			require.Equal(t, "granted", e.Event)
			took := time.Unix(0, e.At).Sub(killed)
			t.Logf("the waiter after the dead one was granted %s after the kill", took)
			require.Less(t, took, fifoSkipBound, "the dead waiter was not skipped within about a second")
			e2 := last.next(t)
			require.Equal(t, "granted", e2.Event)
			require.Greater(t, e2.At, e.At, "the last waiter was granted before the one ahead of it")
		})
	}
}

// stopped reports whether process pid is stopped (state T in /proc/pid/stat).
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

// fifoPassBound is how soon a paused waiter at the head is passed once the
// lock is free: the waiter behind finds the lock free and the head's place
// held at one fallback look, and passes it at the first look a fallback
// period later (looks come every 0.5–1 s), plus a loaded machine's slack.
const fifoPassBound = 6 * time.Second

// A waiter paused (SIGSTOP) at the head of the queue keeps its place but
// never takes the lock: the waiters behind pass it once the lock has been
// free for about a second, in their order, and it takes the lock after
// them once continued.
func TestFIFO_PausedWaiterPassed(t *testing.T) {
	for _, st := range fifoStores {
		t.Run(st.name, func(t *testing.T) {
			db := st.db(t)
			ctx := context.Background()
			c := MustOpen(t, locks.Config{Database: db, Owner: "holder"})
			h, err := c.Locks.Take(ctx, "holder", plan1, application.AcquireOptions{TTL: time.Minute})
			require.NoError(t, err)
			paused := startFIFO(t, db, "paused")
			time.Sleep(fifoGap)
			next := startFIFO(t, db, "next")
			time.Sleep(fifoGap)
			last := startFIFO(t, db, "last")
			time.Sleep(fifoGap)

			require.NoError(t, paused.cmd.Process.Signal(syscall.SIGSTOP))
			require.Eventually(t, func() bool { return stopped(paused.cmd.Process.Pid) }, time.Minute, time.Millisecond,
				"the paused waiter did not stop")
			released := time.Now()
			_, err = h.Release(ctx)
			require.NoError(t, err)

			e := next.next(t)
			require.Equal(t, "granted", e.Event)
			took := time.Unix(0, e.At).Sub(released)
			t.Logf("the waiter behind the paused one was granted %s after the release", took)
			require.Less(t, took, fifoPassBound, "the paused waiter was not passed")
			e2 := last.next(t)
			require.Equal(t, "granted", e2.Event)
			require.Greater(t, e2.At, e.At, "the last waiter was granted before the one ahead of it")

			require.NoError(t, paused.cmd.Process.Signal(syscall.SIGCONT))
			require.Equal(t, "granted", paused.next(t).Event, "the continued waiter did not take the lock")
		})
	}
}
