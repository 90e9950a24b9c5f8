package application

import (
	"time"

	"github.com/cleveragents/locks/domain"
)

// Wakeups carries the news between processes that share a store: that a
// lock may have come free, and that someone waits for one, so that a
// waiter sleeps until the holder lets go instead of polling (nil: poll
// with a growing backoff). A wake-up only says "look now": a waiter still
// looks at the holder's expiry and once per waitFallback, so a lost one
// delays a hand-over but never loses it.
type Wakeups interface {
	// Watch starts watching ref for this process. c receives, coalesced
	// and without ever blocking a sender, whenever a lock on ref may have
	// come free through any process (this one included), and whenever
	// wake-ups may have been lost (a connection that is back after a
	// drop). While the watch is on, Contended(ref) is true in the other
	// processes. stop ends the watch; call it exactly once. A nil c means
	// that ref cannot be watched here (the system ran out of watches, the
	// store closed): the waiter then polls, as without Wakeups.
	Watch(ref domain.ResourceRef) (c <-chan struct{}, stop func())

	// Contended reports whether another process (or another service on
	// the same store) watches ref, as far as this one can tell; false when
	// it cannot tell.
	Contended(ref domain.ResourceRef) bool
}

// WithWakeups lets waiters sleep until a holder in another process lets
// go, instead of polling the store (nil: poll).
func WithWakeups(w Wakeups) Option { return func(s *LockService) { s.wakeups = w } }

const (
	// waitFallback is how often a waiter that receives wake-ups still
	// looks at the store, in case one was lost (jittered: half to all).
	waitFallback = time.Second

	// handOverGrace is how long a process that released a lock another
	// process waits for keeps its own waiters back: it hears its own
	// release first, and would otherwise starve the others (4 processes of
	// 2 waiters: one took almost every grant). A woken remote waiter takes
	// the lock within about a millisecond, or loses the turn.
	handOverGrace = 10 * time.Millisecond
)

// freed is called when this service has released ref: the local waiters
// may try, but after handOverGrace if another process waits for ref.
func (s *LockService) freed(ref domain.ResourceRef) {
	if s.wakeups != nil && s.wakeups.Contended(ref) {
		s.waiters.yieldUntil(ref, time.Now().Add(handOverGrace)) // real time: see waitTurn
	}
	s.waiters.wake(ref)
}

// yieldUntil keeps ref's waiters of this service from trying before t.
func (q *waitQueues) yieldUntil(ref domain.ResourceRef, t time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.yields) >= 64 { // forget the yields that are over
		for r, until := range q.yields {
			if !until.After(t.Add(-handOverGrace)) {
				delete(q.yields, r)
			}
		}
	}
	q.yields[ref] = t
}

// yielding returns how long ref's waiters must still hold back at now.
func (q *waitQueues) yielding(ref domain.ResourceRef, now time.Time) time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	t, ok := q.yields[ref]
	if !ok {
		return 0
	}
	if d := t.Sub(now); d > 0 {
		return d
	}
	delete(q.yields, ref)
	return 0
}
