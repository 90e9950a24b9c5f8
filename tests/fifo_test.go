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
