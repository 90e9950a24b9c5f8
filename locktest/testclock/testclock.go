// Package testclock is a clock for deterministic time-travel tests of code
// that takes, waits for, keeps and loses locks: pass it as locks.Config's
// Clock (or application.NewLockService's), move it with Add, and wait
// until the service is parked on it with BlockUntil or NextTimer, instead
// of sleeping.
//
// It implements what the lock service asks of a clock (Now and After,
// application.Clock and application.Timers) and the reading methods of
// github.com/benbjohnson/clock's Clock (Since, Until, Sleep), so code
// that uses only those of clock.Mock moves to it by changing the
// constructor. It
// differs from clock.Mock (v1.3.5) in what a test needs to trust it:
//
//   - a timer fires exactly once, even when it is set while Add runs
//     (clock.Mock can fire it twice, and then deadlocks sending to its full
//     channel while it holds its lock): Add moves the clock and fires what
//     is due as one step, and a timer set meanwhile (or a Now read) waits
//     for that step and counts from the time Add moved to;
//   - it records every timer set, so that a test can wait until the code
//     under test is parked on the clock before moving it (BlockUntil,
//     NextTimer), with a real-time limit that fails the test saying what
//     it waited for, rather than hanging;
//   - Add never sleeps: it fires what is due and returns;
//   - Pause and Resume hold back firing while the time moves on, as for a
//     process stopped past its lock's expiry.
//
// It does not implement clock.Clock's Timer, Ticker, Tick, AfterFunc,
// WithDeadline and WithTimeout: their *clock.Timer and *clock.Ticker
// cannot be built outside that package. The lock service uses none of
// them.
//
// On PostgreSQL, expiry is decided on the server's clock unless the
// service decides it on its own. locks.Open does so whenever its Clock is
// a mock clock such as this one (it implies Config.LocalTime). An
// embedder that builds the service itself (postgres.Open, then
// application.NewLockService with this clock) must set
// postgres.Options.LocalTime: without it, moving this clock moves no
// lock's expiry on PostgreSQL, and a wait for an expiry the test moved
// past never ends.
package testclock

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// DefaultLimit is how long, in real time, BlockUntil and NextTimer wait
// before they fail the test: long enough for a loaded machine.
const DefaultLimit = 10 * time.Second

// Clock is a mock clock whose time moves only when the test moves it. Its
// methods may be called from any goroutine; Add and Set are serialised.
type Clock struct {
	moving sync.Mutex // serialises Add and Set

	mu      sync.Mutex
	now     time.Time
	pending []*timer // set and not yet fired, in order of due time, then of setting
	seq     uint64
	set     int                // how many timers were set
	setc    chan time.Duration // the duration of each timer set, in order, until read
	lost    int                // timers set while setc was full
	changed chan struct{}      // closed, and replaced, when a timer is set or fires
	limit   time.Duration
	paused  bool // moving the clock fires nothing (Pause)
}

// setBuffer is how many timers' durations the clock keeps for NextTimer
// and Timers until they are read.
const setBuffer = 1 << 14

type timer struct {
	due time.Time
	seq uint64
	c   chan time.Time
}

// New returns a clock that reads start until it is moved; a zero start
// means 2000-01-01 00:00 UTC.
func New(start time.Time) *Clock {
	if start.IsZero() {
		start = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &Clock{now: start, setc: make(chan time.Duration, setBuffer), changed: make(chan struct{}), limit: DefaultLimit}
}

// SetLimit sets how long, in real time, BlockUntil and NextTimer wait
// before failing the test (DefaultLimit until set).
func (c *Clock) SetLimit(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limit = d
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Since returns the time elapsed on the clock since t.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Until returns the time on the clock until t.
func (c *Clock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// Sleep returns once d has passed on the clock: once a test has moved it
// that far.
func (c *Clock) Sleep(d time.Duration) { <-c.After(d) }

// After returns a channel that receives the clock's time once d has
// passed on it; at once if d <= 0. The timer counts as pending (see
// Pending, BlockUntil) from the moment After returns until it fires.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1) // fired once, never blocks
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set++
	select {
	case c.setc <- d:
	default: // NextTimer reports it: never block the code under test
		c.lost++
	}
	defer c.notify()
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.seq++
	t := &timer{due: c.now.Add(d), seq: c.seq, c: ch}
	i, _ := slices.BinarySearchFunc(c.pending, t, func(a, b *timer) int {
		if n := a.due.Compare(b.due); n != 0 {
			return n
		}
		return compare(a.seq, b.seq)
	})
	c.pending = slices.Insert(c.pending, i, t)
	return ch
}

func compare(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// notify wakes the goroutines waiting in BlockUntil and NextTimer; c.mu
// is held.
func (c *Clock) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Add moves the clock forward by d, firing, in order of due time, every
// timer due by then (each once, receiving its due time), unless the clock
// is paused (Pause). Now, After and
// the other methods wait while it runs, and see the clock at its target.
// It returns once the timers have fired; the
// goroutines they wake run on their own, so wait for what they do next
// (BlockUntil, NextTimer, or the code's own results) rather than sleeping.
func (c *Clock) Add(d time.Duration) {
	c.moving.Lock()
	defer c.moving.Unlock()
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	c.moveTo(target)
}

// Set moves the clock to t, firing every timer due by then as Add does.
// A t before the clock's time sets it back and fires nothing.
func (c *Clock) Set(t time.Time) {
	c.moving.Lock()
	defer c.moving.Unlock()
	c.moveTo(t)
}

func (c *Clock) moveTo(target time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.paused {
		c.fireLocked(target)
	}
	c.now = target
	c.notify()
}

// fireLocked fires, in order, every pending timer due by target, moving
// the clock to each one's due time if it is ahead; c.mu is held.
func (c *Clock) fireLocked(target time.Time) {
	for len(c.pending) > 0 && !c.pending[0].due.After(target) {
		t := c.pending[0]
		// Taken off the list under the lock before it fires: no other
		// Add, and no After, can see it again, so it fires once.
		c.pending = c.pending[1:]
		if t.due.After(c.now) {
			c.now = t.due
		}
		t.c <- c.now // buffered, and sent once: never blocks
	}
}

// Pause holds back firing: from now until Resume, Add and Set move the
// clock's time, which Now and the other readers see, but fire no timer;
// timers set meanwhile are pending as usual. It is a process stopped
// (SIGSTOP, a debugger, a long GC or VM pause) while the time runs on:
// the code under test finds, once resumed, that its lock expired and
// another owner took it in between, which is what a test of fencing
// needs. A test may also use it to act between a move and the timers
// it makes due. It pauses every timer on the clock: code that must keep
// running during the pause (another process of the test) does not wait
// on this clock's timers meanwhile.
func (c *Clock) Pause() {
	c.moving.Lock()
	defer c.moving.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paused = true
}

// Resume ends a Pause: it fires, in order of due time, every timer due
// by the clock's time, each once and late, receiving the time the clock
// reads (as a resumed process sees its overdue timers fire at once), and
// later moves fire timers again. On a clock not paused it does nothing.
func (c *Clock) Resume() {
	c.moving.Lock()
	defer c.moving.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.paused {
		return
	}
	c.paused = false
	c.fireLocked(c.now)
	c.notify()
}

// Pending returns how many timers are set and have not fired. A timer that
// its setter abandoned (it stopped waiting on it for another reason)
// stays pending until the clock passes it.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// PendingIn returns, in order, how long each pending timer has left to run.
func (c *Clock) PendingIn() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pendingInLocked()
}

// BlockUntil returns once at least n timers are pending on the clock: the
// code under test is parked on them, and moving the clock reaches it. It
// fails tb (tb.Fatalf, so call it from the test's goroutine) if that takes
// longer than the clock's limit in real time, saying what it waited for
// and what was pending.
func (c *Clock) BlockUntil(tb testing.TB, n int) {
	tb.Helper()
	c.await(tb, func() bool { return len(c.pending) >= n }, func() string {
		return fmt.Sprintf("%d timers pending on the clock", n)
	})
}

// NextTimer returns the duration of the next timer set on the clock, in
// the order they were set, waiting for it to be set if need be: each call
// returns the next one, so a test sees every timer the code sets, even
// those that fire or are abandoned at once. It fails tb as BlockUntil
// does. It reads the channel that Timers returns: use one or the other.
func (c *Clock) NextTimer(tb testing.TB) time.Duration {
	tb.Helper()
	c.mu.Lock()
	lost, limit := c.lost, c.limit
	c.mu.Unlock()
	if lost > 0 {
		tb.Fatalf("testclock: %d timers were set while %d were waiting to be read by NextTimer: read each as it is set, or never", lost, setBuffer)
		return 0
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case d := <-c.setc:
		return d
	case <-t.C:
	}
	select {
	case d := <-c.setc:
		return d
	default:
	}
	c.mu.Lock()
	msg := fmt.Sprintf("testclock: waited %s (real time) for the next timer to be set on the clock; the clock reads %s, with %d timers pending (due in %v) of %d set",
		limit, c.now.Format(time.RFC3339Nano), len(c.pending), c.pendingInLocked(), c.set)
	c.mu.Unlock()
	tb.Fatal(msg)
	return 0
}

// Timers returns a channel that receives the duration of each timer set on
// the clock, in order, for a test that waits for a timer along with other
// events (in a select). It is the channel NextTimer reads: use one or the
// other.
func (c *Clock) Timers() <-chan time.Duration { return c.setc }

// await waits, in real time, until ready (called with c.mu held) is true.
func (c *Clock) await(tb testing.TB, ready func() bool, what func() string) {
	tb.Helper()
	c.mu.Lock()
	limit := time.NewTimer(c.limit)
	defer limit.Stop()
	for !ready() {
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
			c.mu.Lock()
			continue
		case <-limit.C:
		}
		c.mu.Lock()
		if ready() {
			break
		}
		msg := fmt.Sprintf("testclock: waited %s (real time) for %s; the clock reads %s, with %d timers pending (due in %v) of %d set",
			c.limit, what(), c.now.Format(time.RFC3339Nano), len(c.pending), c.pendingInLocked(), c.set)
		c.mu.Unlock()
		tb.Fatal(msg)
		return
	}
	c.mu.Unlock()
}

func (c *Clock) pendingInLocked() []time.Duration {
	out := make([]time.Duration, len(c.pending))
	for i, t := range c.pending {
		out[i] = t.due.Sub(c.now)
	}
	return out
}
