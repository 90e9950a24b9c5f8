package testclock_test

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/locktest/testclock"
)

// mover is what the stress below needs of a mock clock.
type mover interface {
	After(time.Duration) <-chan time.Time
	Add(time.Duration)
}

// setWhileMoving sets timers from one goroutine while another moves the
// clock, rounds times, and returns how many rounds hung: an Add, or a wait
// for a timer that Add passed, that did not return in real time.
func setWhileMoving(clk mover, rounds int) (hangs int) {
	for range rounds {
		done := make(chan struct{})
		go func() {
			defer close(done)
			var wg sync.WaitGroup
			wg.Add(5)
			for i := range 4 {
				go func() {
					defer wg.Done()
					for range 50 {
						clk.After(time.Duration(i) * time.Millisecond)
					}
				}()
			}
			go func() {
				defer wg.Done()
				for range 50 {
					clk.Add(time.Millisecond)
				}
			}()
			wg.Wait()
			clk.Add(time.Second) // everything set is now due
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			hangs++
			return hangs // the clock is stuck for good
		}
	}
	return hangs
}

func TestClock_SetWhileMoving(t *testing.T) {
	if os.Getenv("TESTCLOCK_SHOW_MOCK_BUG") != "" {
		// clock.Mock v1.3.5 fires a timer set while Add runs twice
		// (Timer's own runNextTimer races Add's) and the second send, to a
		// full channel, deadlocks with the mock's lock held.
		t.Run("clock.Mock", func(t *testing.T) {
			if hangs := setWhileMoving(clock.NewMock(), 200); hangs > 0 {
				t.Fatalf("clock.Mock hung in %d rounds", hangs)
			}
		})
	}
	clk := testclock.New(time.Time{})
	if hangs := setWhileMoving(clk, 200); hangs > 0 {
		t.Fatalf("hung in %d rounds", hangs)
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d timers still pending after the clock passed them all", n)
	}
}

func TestClock_FiresOnceInOrder(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := testclock.New(start)
	late, early := clk.After(2*time.Second), clk.After(time.Second)
	now := clk.After(0)
	if got := <-now; !got.Equal(start) {
		t.Fatalf("After(0) fired at %s, want at once, at %s", got, start)
	}
	clk.Add(1500 * time.Millisecond)
	if got := <-early; !got.Equal(start.Add(time.Second)) {
		t.Fatalf("the 1s timer fired at %s", got)
	}
	select {
	case got := <-late:
		t.Fatalf("the 2s timer fired at %s, after a move of 1.5s", got)
	default:
	}
	clk.Add(time.Hour)
	if got := <-late; !got.Equal(start.Add(2 * time.Second)) {
		t.Fatalf("the 2s timer fired at %s, want at its due time", got)
	}
	select {
	case got := <-early:
		t.Fatalf("the 1s timer fired a second time, at %s", got)
	default:
	}
	if got, want := clk.Now(), start.Add(time.Hour+1500*time.Millisecond); !got.Equal(want) {
		t.Fatalf("the clock reads %s, want %s", got, want)
	}
}

func TestClock_BlockUntilAndNextTimer(t *testing.T) {
	clk := testclock.New(time.Time{})
	slept := make(chan struct{})
	go func() {
		clk.Sleep(30 * time.Second)
		close(slept)
	}()
	clk.BlockUntil(t, 1)
	if d := clk.NextTimer(t); d != 30*time.Second {
		t.Fatalf("NextTimer = %s, want the sleeper's 30s", d)
	}
	clk.Add(30 * time.Second)
	<-slept
}

// fatalRecorder records a Fatal instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatal(args ...any) { r.msg = args[0].(string) }
func (r *fatalRecorder) Helper()           {}

func TestClock_BlockUntilFailsSayingWhat(t *testing.T) {
	clk := testclock.New(time.Time{})
	clk.SetLimit(50 * time.Millisecond)
	clk.After(time.Minute)
	r := &fatalRecorder{TB: t}
	clk.BlockUntil(r, 2)
	const want = "testclock: waited 50ms (real time) for 2 timers pending on the clock; the clock reads 2000-01-01T00:00:00Z, with 1 timers pending (due in [1m0s]) of 1 set"
	if r.msg != want {
		t.Fatalf("BlockUntil failed with %q, want %q", r.msg, want)
	}
	r.msg = ""
	clk.NextTimer(r)
	if r.msg != "" {
		t.Fatalf("NextTimer failed with a timer set: %q", r.msg)
	}
	clk.NextTimer(r)
	if r.msg == "" {
		t.Fatal("NextTimer returned with no second timer set")
	}
}

func TestClock_PauseHoldsBackFiring(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := testclock.New(start)
	before := clk.After(time.Second)
	clk.Pause()
	during := clk.After(500 * time.Millisecond) // set while paused
	clk.Add(2 * time.Second)
	if got, want := clk.Now(), start.Add(2*time.Second); !got.Equal(want) {
		t.Fatalf("a paused clock reads %s after Add, want %s: its time moves on", got, want)
	}
	select {
	case got := <-before:
		t.Fatalf("a timer fired at %s while the clock was paused", got)
	case got := <-during:
		t.Fatalf("a timer set while paused fired at %s while the clock was paused", got)
	default:
	}
	if n := clk.Pending(); n != 2 {
		t.Fatalf("%d timers pending while paused, want both", n)
	}
	clk.Resume()
	for name, c := range map[string]<-chan time.Time{"set before the pause": before, "set during it": during} {
		select {
		case got := <-c:
			if !got.Equal(start.Add(2 * time.Second)) {
				t.Fatalf("the timer %s fired at %s, want late, at the time of Resume", name, got)
			}
		default:
			t.Fatalf("the timer %s, due, did not fire on Resume", name)
		}
	}
	after := clk.After(time.Second)
	clk.Resume() // not paused: nothing to do
	clk.Add(time.Second)
	if got := <-after; !got.Equal(start.Add(3 * time.Second)) {
		t.Fatalf("a timer set after Resume fired at %s, want at its due time", got)
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d timers pending once all fired", n)
	}
}
