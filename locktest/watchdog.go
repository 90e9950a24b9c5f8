package locktest

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stuckAfter is how long a subtest of Run may go without finishing, or
// completing a call through the fixture's helpers (its own calls, not
// counting its subtests, which have a watchdog each), before it is
// reported as stuck. No call of the suite takes a second on a
// working store, even on a loaded machine; a store that takes this long
// has a lock or mutex that was not released, or waits on something that
// ignores the call's context. It is doubled under the race detector,
// which slows every call.
const stuckAfter = 30 * time.Second

// stuckAfterHang is the bound once a subtest of this test binary has
// hung: the run has failed already, and a store that leaves its mutex
// locked on one path hangs most subtests; the short bound has them fail
// in seconds each, rather than the suite taking an hour to report them.
// It is not stretched under -race: a call of a working store takes
// milliseconds there too, and a false report can only add to a run that
// has failed.
const stuckAfterHang = 3 * time.Second

// hung records that a subtest of this test binary was found stuck.
var hung atomic.Bool

// watched is the state of one running subtest of Run, kept for its
// subtests to report to.
type watched struct {
	mu       sync.Mutex
	children int       // subtests running now
	progress time.Time // when the last subtest started or ended
}

var (
	watchMu sync.Mutex
	watches = map[*testing.T]*watched{}
)

// run runs body as the subtest name of t, under a watchdog: body runs on
// a goroutine of its own, and when it has not returned within the bound
// (stuckAfter; not counting the time its own subtests run, which are
// watched each), the subtest fails with a message naming it, the calls
// that are stuck (the stacks of the suite's goroutines that are still in
// the store or the service) and the likely cause, and ends, leaving the
// stuck goroutines behind. Without it, one store call that never returns
// (a mutex left locked on an error path) keeps the suite waiting until go
// test's timeout, ten minutes by default, and the report is a panic.
//
// A FailNow or SkipNow of body (require, t.Skip) ends body's goroutine;
// run ends the subtest the same way on its own goroutine. A panic of body
// goes on in the subtest's goroutine, where testing reports it.
func run(t *testing.T, name string, body func(t *testing.T)) bool {
	watchMu.Lock()
	parent := watches[t]
	watchMu.Unlock()
	if parent != nil {
		parent.child(+1)
		defer parent.child(-1)
	}
	return t.Run(name, func(t *testing.T) {
		t.Helper()
		w := &watched{progress: time.Now()}
		watchMu.Lock()
		watches[t] = w
		watchMu.Unlock()
		defer func() {
			watchMu.Lock()
			delete(watches, t)
			watchMu.Unlock()
		}()

		done := make(chan struct{})
		var (
			returned bool
			panicked any
		)
		go func() {
			defer close(done)
			defer func() {
				if !returned {
					panicked = recover()
				}
			}()
			body(t)
			returned = true
		}()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				switch {
				case panicked != nil:
					panic(panicked)
				case returned:
					return
				case t.Skipped():
					t.SkipNow()
				default:
					t.FailNow() // body's require ended its goroutine
				}
			case <-tick.C:
				if bound := w.stuckFor(); bound > 0 {
					hung.Store(true)
					t.Errorf("stuck: %s has not returned in %s. "+
						"A call into the store (or the service over it) does not return: most likely a lock or mutex "+
						"that a store method does not release on one of its paths (an error return, a panic), "+
						"so that every later call waits for it; or a call that ignores its context. "+
						"The subtest ends here; its goroutines stay blocked. The stuck calls:\n%s",
						t.Name(), bound, stuckCalls())
					return
				}
			}
		}
	})
}

// child records that a subtest of w started (+1) or ended (-1), or that
// w made progress (0): the time a subtest runs is its own watchdog's, not
// its parent's, and the bound runs from the last progress.
func (w *watched) child(delta int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.children += delta
	w.progress = time.Now()
}

// progressed records that the subtest t made a call that returned: the
// bound runs from there, so that a subtest of many calls (ManyBatches'
// thousands of acquisitions) is bounded per call, not in all.
func progressed(t *testing.T) {
	watchMu.Lock()
	w := watches[t]
	watchMu.Unlock()
	if w != nil {
		w.child(0)
	}
}

// stuckFor returns the bound that w has overrun, or 0 while it has not
// (or while a subtest of it runs).
func (w *watched) stuckFor() time.Duration {
	bound := stuckAfter * raceScale
	if hung.Load() {
		bound = stuckAfterHang
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.children > 0 || time.Since(w.progress) < bound {
		return 0
	}
	return bound
}

var (
	reportedMu sync.Mutex
	reported   = map[string]bool{} // "goroutine N" of the stuck calls reported
)

// stuckCalls returns the stacks of the goroutines that run the suite's
// code, without the watchdog's own and testing's: the frames name the
// store method that waits, the call of the service it serves, and the
// line of the subtest that made it (and with it the resource).
func stuckCalls() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	reportedMu.Lock()
	defer reportedMu.Unlock()
	var out []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		s := string(g)
		head, _, _ := strings.Cut(s, " [")
		switch {
		case !strings.Contains(s, "/locktest."), strings.Contains(s, "locktest.stuckCalls"),
			strings.Contains(s, "testing.(*T).Run("),                                                  // a parent waiting for its subtest
			strings.Contains(s, "locktest.run.func1(") && !strings.Contains(s, "locktest.run.func1."), // a watchdog
			reported[head]: // left behind by a subtest reported earlier
			continue
		}
		reported[head] = true
		out = append(out, s)
	}
	if len(out) == 0 {
		return "(no goroutine of the suite found)"
	}
	const most = 4 // sixteen racers stuck alike say no more than four
	if len(out) > most {
		out = append(out[:most], fmt.Sprintf("… and %d more goroutines", len(out)-most))
	}
	return strings.Join(out, "\n\n")
}
