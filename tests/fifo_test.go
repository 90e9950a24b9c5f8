package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// fifoEvent is what a fifo worker prints: "waiting" just before its Do,
// "granted" once its work runs, "gave up" when its wait ended without it.
type fifoEvent struct {
	Event string `json:"event"`
	At    int64  `json:"at"` // time.Now().UnixNano()
}

// fifoHold is how long a granted fifo worker holds plan1.
const fifoHold = 50 * time.Millisecond

// workerFIFO waits for plan1 in Do, holds it fifoHold, and exits; a line
// "quit" on its stdin ends its wait (a waiter that gives up).
func workerFIFO() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	owner := os.Getenv(envOwner)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: owner})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer c.Close()
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if sc.Text() == "quit" {
				cancel()
			}
		}
	}()
	reportJSON(fifoEvent{Event: "waiting", At: time.Now().UnixNano()})
	err = c.Locks.Do(ctx, owner, plan1, application.AcquireOptions{Wait: true, TTL: time.Minute}, func(context.Context, domain.Lock) error {
		reportJSON(fifoEvent{Event: "granted", At: time.Now().UnixNano()})
		time.Sleep(fifoHold) // the work: the next waiter waits meanwhile
		return nil
	})
	if ctx.Err() != nil {
		return reportJSON(fifoEvent{Event: "gave up", At: time.Now().UnixNano()})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "do:", err)
		return 1
	}
	return 0
}

// fifoWaiter is a running fifo worker.
type fifoWaiter struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan fifoEvent
}

// startFIFO starts a fifo worker as owner on db and returns once it waits.
func startFIFO(t *testing.T, db, owner string) *fifoWaiter {
	t.Helper()
	cmd := startWorker(t, "fifo", envDB+"="+db, envOwner+"="+owner)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	w := &fifoWaiter{cmd: cmd, stdin: in, events: make(chan fifoEvent, 4)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		defer close(w.events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e fifoEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				w.events <- e
			}
		}
	}()
	require.Equal(t, "waiting", w.next(t).Event)
	return w
}

// next returns w's next event, failing the test if none comes within a minute.
func (w *fifoWaiter) next(t *testing.T) fifoEvent {
	t.Helper()
	select {
	case e, ok := <-w.events:
		require.True(t, ok, "the worker exited without a word")
		return e
	case <-time.After(time.Minute):
		t.Fatal("the worker said nothing within a minute")
		return fifoEvent{}
	}
}

// fifoStores are the stores the order across processes holds on.
var fifoStores = []struct {
	name string
	db   func(t *testing.T) string
}{
	{"SQLite", func(t *testing.T) string {
		if runtime.GOOS != "linux" {
			t.Skip("no wake file here (it needs OFD locks): no order across processes")
		}
		return filepath.Join(t.TempDir(), "agents.db")
	}},
	{"PostgreSQL", func(t *testing.T) string { return testdb.Postgres(t) }},
}

// fifoGap is how far apart the waiters begin to wait (issue 39).
const fifoGap = 300 * time.Millisecond

// Four processes begin to wait 300 ms apart for a lock this process
// holds: once it is released they are granted in the order they began
// to wait, in each of three rounds.
func TestFIFO_AcrossProcesses(t *testing.T) {
	for _, st := range fifoStores {
		t.Run(st.name, func(t *testing.T) {
			db := st.db(t)
			ctx := context.Background()
			c := MustOpen(t, locks.Config{Database: db, Owner: "holder"})
			for round := range 3 {
				h, err := c.Locks.Take(ctx, "holder", plan1, application.AcquireOptions{TTL: time.Minute})
				require.NoError(t, err)
				var ws []*fifoWaiter
				for i := range 4 {
					ws = append(ws, startFIFO(t, db, fmt.Sprintf("r%d-w%d", round, i)))
					time.Sleep(fifoGap)
				}
				_, err = h.Release(ctx)
				require.NoError(t, err)
				granted := make([]int64, len(ws))
				for i, w := range ws {
					e := w.next(t)
					require.Equal(t, "granted", e.Event, "waiter %d", i)
					granted[i] = e.At
					require.NoError(t, w.cmd.Wait())
				}
				order := make([]int, len(ws))
				for i := range order {
					order[i] = i
				}
				slices.SortFunc(order, func(a, b int) int { return int(granted[a] - granted[b]) })
				t.Logf("round %d: granted in the order %v", round, order)
				require.Equal(t, []int{0, 1, 2, 3}, order, "round %d: not granted in the order they began to wait", round)
			}
		})
	}
}

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
