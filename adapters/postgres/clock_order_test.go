package postgres

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
)

// The order of two readings of the server's clock that disagree (its clock
// stepped between them) says which is right, when the ticks tell it: the
// server read each between its statement's send and its answer. These
// place the ticks where a loaded host, a waiting write or a slow link may
// put them.

// us is the tick n microseconds after the epoch; the server's clock
// before its step reads the same.
func us(n int) time.Time { return monotonicEpoch.Add(time.Duration(n) * time.Microsecond) }

// orderedClock is a ServerClock anchored on a statement read at [sent, got] (µs)
// that saw the server's clock off the host's ticks by off.
func orderedClock(sent, got int, off time.Duration) *ServerClock {
	c := &ServerClock{local: clock.NewMock(), kick: make(chan struct{}, 1)}
	c.observe(us(sent), us(got), us((sent+got)/2).Add(off))
	<-c.kick
	return c
}

// checkCovers fails unless c's estimate at tick now is off the server's
// time truth by no more than the uncertainty it states.
func checkCovers(t *testing.T, c *ServerClock, now, truth time.Time, msg string) {
	t.Helper()
	c.mu.RLock()
	est, u := c.at.Add(now.Sub(c.mark)), c.uncertainty
	c.mu.RUnlock()
	if off := est.Sub(truth); off.Abs() > u {
		t.Errorf("%s: the estimate is off the server's time by %v, beyond the uncertainty %v it states", msg, off, u)
	}
}

func checkKicked(t *testing.T, c *ServerClock, want bool, msg string) {
	t.Helper()
	if got := len(c.kick) == 1; got != want {
		t.Errorf("%s: a measurement asked for: %v, want %v", msg, got, want)
	}
}

// A write sent at 5 s waits until 12 s; a statement sent at 10 s anchors
// the estimate meanwhile, before the server's clock steps 30 s forward;
// the write reads the stepped clock at 11 s. Sent earlier, it still
// answered later: the estimate must not stay 30 s behind.
func TestServerClock_LaterAnsweredReadingCorrects(t *testing.T) {
	c := orderedClock(10000000, 10002000, 0)
	c.observe(us(5000000), us(12000000), us(11000000).Add(30*time.Second))
	checkCovers(t, c, us(12000000), us(12000000).Add(30*time.Second), "after the write that read the stepped clock")
	checkKicked(t, c, true, "after the write that read the stepped clock")
}

// The server's clock steps 30 s back at 9 s; a write sent at 5 s read it
// before the step, at 6 s, and waited until 12 s; a statement sent at
// 10 s read it after the step, and anchored the estimate. The write's
// old reading may not be taken for the truth with a narrow uncertainty:
// neither is known to be the later, so the estimate covers both until a
// measurement, asked for at once, tells; a measurement made meanwhile
// does not narrow it on one of them.
func TestServerClock_OldReadingAnsweredLateDoesNotMislead(t *testing.T) {
	for _, step := range []time.Duration{-30 * time.Second, 30 * time.Second} {
		t.Run(step.String(), func(t *testing.T) {
			c := orderedClock(10000000, 10002000, step)
			c.observe(us(5000000), us(12000000), us(6000000))
			truth := us(12000000).Add(step)
			checkCovers(t, c, us(12000000), truth, "after the write's old reading")
			checkKicked(t, c, true, "after the write's old reading")
			if step > 0 { // the estimate is not dragged behind the server's time
				c.mu.RLock()
				est := c.at.Add(us(12000000).Sub(c.mark))
				c.mu.RUnlock()
				if est.Before(truth) {
					t.Errorf("the old reading dragged the estimate %v behind the server's time", truth.Sub(est))
				}
			}

			c.mu.Lock()
			c.take(us(11000000), us(11001000), us(11000500), 0, true) // a measurement sent meanwhile, before the step
			c.mu.Unlock()
			checkCovers(t, c, us(12000000), truth, "after a measurement made during the write")

			if step < 0 { // a write sent after both, answered, settles it too
				c.observe(us(12500000), us(12502000), us(12501000).Add(step))
				checkCovers(t, c, us(13000000), us(13000000).Add(step), "after a write sent after both")
				if _, u, _ := c.Offset(); u > time.Millisecond {
					t.Errorf("a write sent after both readings left an uncertainty of %v", u)
				}
			}

			c.mu.Lock()
			c.take(us(13000000), us(13001000), us(13000500).Add(step), 0, true) // the measurement asked for
			c.mu.Unlock()
			checkCovers(t, c, us(14000000), us(14000000).Add(step), "after the measurement asked for")
			if _, u, _ := c.Offset(); u > time.Millisecond {
				t.Errorf("the measurement asked for left an uncertainty of %v", u)
			}
		})
	}
}

// A reading answered before the estimate's was asked for is older: the
// step it disagrees by happened before the estimate's reading, which saw it.
func TestServerClock_OlderReadingIgnored(t *testing.T) {
	c := orderedClock(10000000, 10002000, 30*time.Second)
	c.observe(us(5000000), us(6000000), us(5500000))
	checkCovers(t, c, us(12000000), us(12000000).Add(30*time.Second), "after the older reading")
	checkKicked(t, c, false, "after the older reading")
	if _, u, _ := c.Offset(); u > time.Millisecond {
		t.Errorf("the older reading widened the uncertainty to %v", u)
	}
}
