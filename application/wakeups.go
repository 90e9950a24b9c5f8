package application

import (
	"time"

	"github.com/cleveragents/locks/domain"
)

// Wakeups tells processes sharing a store that a lock may have come free
// and that someone waits for one (nil: poll). A wake-up only says "look
// now": waiters still look at the expiry and every waitFallback, so a lost
// one delays a hand-over but never loses it.
type Wakeups interface {
	// Watch starts watching ref: c receives, coalesced and never blocking a
	// sender, whenever a lock on ref may have come free in any process or
	// wake-ups may have been lost, and Contended(ref) is true elsewhere
	// meanwhile. Call stop exactly once. A nil c: ref cannot be watched
	// here (out of watches, store closed), so the waiter polls.
	Watch(ref domain.ResourceRef) (c <-chan struct{}, stop func())
	// Contended reports whether another process (or service on the store)
	// watches ref, as far as this one can tell; false when it cannot tell.
	Contended(ref domain.ResourceRef) bool
}

// WithWakeups lets waiters sleep until a holder in another process lets
// go, instead of polling the store (nil: poll). If w is also a Queue,
// waiters of different processes take a lock in the order they began to
// wait (see waitTurn).
func WithWakeups(w Wakeups) Option {
	return func(s *LockService) {
		s.wakeups = w
		s.queue, _ = w.(Queue)
	}
}

const (
	waitFallback = time.Second // how often a waiter with wake-ups still looks, in case one was lost (jittered)
	// handOverGrace holds back the local waiters of a process that released
	// a lock another process waits for: it hears its own release first and
	// would starve the others. A woken remote waiter takes it within ~1 ms.
	handOverGrace = 10 * time.Millisecond
)

// freed is called when this service has released ref: the local waiters
// may try, but after handOverGrace if another process waits for ref; a
// handle of this service that held it (an owner's release) looks.
func (s *LockService) freed(ref domain.ResourceRef) {
	if s.wakeups != nil && s.wakeups.Contended(ref) {
		s.waiters.yieldUntil(ref, time.Now().Add(handOverGrace)) // real time: see waitTurn
	}
	s.waiters.wake(ref)
	s.holders.poke(ref)
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
