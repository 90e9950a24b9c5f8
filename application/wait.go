package application

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cleveragents/locks/domain"
)

// A poller's backoff: small to see a release at once, capped to spare the store.
const (
	waitBackoffMin = 5 * time.Millisecond
	waitBackoffMax = time.Second
)

// waitQueues holds each resource's waiters in arrival order; only the head tries.
type waitQueues struct {
	mu     sync.Mutex
	queues map[domain.ResourceRef][]*waiter
	// yields: until when to hold back on a resource just handed over (freed).
	yields map[domain.ResourceRef]time.Time
	now    func() time.Time // reads a mock clock the waiters' timers run on; nil for real timers
	// placing is held from a waiter's join to its place in the Queue, so
	// that this process's places are in the order of its queues: a head
	// placed after the waiter behind it could wait for another process's
	// waiter that waits for that one.
	placing sync.Mutex
}

type waiter struct {
	wake chan struct{} // receives when the waiter becomes the head or should try again
	// parked: asleep with every timer bounding the sleep set (see Waiting); due,
	// the earliest one's instant, past which it counts as awake, drained or not.
	parked bool
	timers [2]<-chan time.Time
	due    time.Time
	news   <-chan struct{} // the wake-ups from other processes it sleeps on
}

// asleep says whether w is parked with no wake-up pending; q.mu is held.
func (q *waitQueues) asleep(w *waiter) bool {
	if !w.parked || len(w.wake) > 0 || len(w.news) > 0 {
		return false
	}
	if !w.due.IsZero() && q.now != nil && !q.now().Before(w.due) {
		return false // a timer is due: the waiter is waking, drained or not
	}
	for _, c := range w.timers {
		if c != nil && len(c) > 0 {
			return false
		}
	}
	return true
}

// timer is a waiter's timer; moved: the clock moved while it was set.
type timer struct {
	c     <-chan time.Time
	due   time.Time
	moved bool
}

// after sets a timer of d, due read before it is set: a waiter stops
// counting as parked no later than it wakes.
func (s *LockService) after(d time.Duration) timer {
	if s.waiters.now == nil {
		return timer{c: s.timers.After(d)}
	}
	before := s.waiters.now()
	t := timer{c: s.timers.After(d), due: before.Add(d)}
	t.moved = s.jumps && !s.waiters.now().Equal(before) // only a clock that tests move jumps
	return t
}

// setParked records w's timers and wake-ups and parks it; q.mu is held.
func (w *waiter) setParked(news <-chan struct{}, timers ...timer) {
	w.parked, w.news = true, news
	w.timers, w.due = [2]<-chan time.Time{}, time.Time{}
	for i, t := range timers {
		if t.c == nil {
			continue
		}
		w.timers[i] = t.c
		if !t.due.IsZero() && (w.due.IsZero() || t.due.Before(w.due)) {
			w.due = t.due
		}
	}
}

// join queues a waiter for ref, woken at once as the head.
func (q *waitQueues) join(ref domain.ResourceRef, expired timer) *waiter {
	w := &waiter{wake: make(chan struct{}, 1)}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queues[ref] = append(q.queues[ref], w)
	if len(q.queues[ref]) == 1 {
		w.wake <- struct{}{}
	} else {
		w.setParked(nil, expired)
	}
	return w
}

func (q *waitQueues) unpark(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.parked = false
}

// leave removes w and, if w was the head, wakes the next.
func (q *waitQueues) leave(ref domain.ResourceRef, w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	queue := q.queues[ref]
	for i, x := range queue {
		if x != w {
			continue
		}
		queue = append(queue[:i:i], queue[i+1:]...)
		if len(queue) == 0 {
			delete(q.queues, ref)
			return
		}
		q.queues[ref] = queue
		if i == 0 {
			wakeHead(queue)
		}
		return
	}
}

func (q *waitQueues) wake(ref domain.ResourceRef) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if queue := q.queues[ref]; len(queue) > 0 {
		wakeHead(queue)
	}
}

func (q *waitQueues) wakeAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, queue := range q.queues {
		wakeHead(queue)
	}
}

// wakeHead wakes queue's head; q.mu is held.
func wakeHead(queue []*waiter) {
	queue[0].parked = false
	select {
	case queue[0].wake <- struct{}{}:
	default:
	}
}

// Waiting returns how many callers wait for ref's lock, parked with every
// timer set: a test may wait for Waiting(ref) == n, then move a mock clock.
func (s *LockService) Waiting(ref domain.ResourceRef) int {
	q := s.waiters
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, w := range q.queues[ref] {
		if q.asleep(w) {
			n++
		}
	}
	return n
}

// errDeadline refuses a decision made after its wait had timed out.
var errDeadline = errors.New("the wait timed out before this decision")

// beforeDeadline returns decide and its Op; with a deadline, decide refusing
// from notAfter on, and no Op: one jump of a test's clock past the timeout
// and the expiry must not let a look take a lock freed after the timeout.
func (s *LockService) beforeDeadline(decide rule, one *Op, notAfter time.Time) (rule, *Op) {
	if notAfter.IsZero() {
		return decide, one
	}
	return func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
		if !s.waiters.now().Before(notAfter) {
			return Change{Kind: ChangeNone}, errDeadline
		}
		return decide(cur, owner, ref, now, expires)
	}, nil
}

// waitTurn queues for ref and, as the head, calls try until it returns no
// *domain.LockConflictError, or ctx ends, timeout passes or the service
// closes (then the last conflict, with Waited). Another process's holder is
// watched through Wakeups or polled, never past the holder's expiry.
//
// With a Queue, the waiter also takes a place among the other processes'
// waiters as it begins to wait, and tries only once no live waiter of
// another process took one before it; until then it sleeps as any waiter
// does, woken by releases and by waiters that leave without the lock, and
// looks again every waitFallback, which is how a waiter that died is
// skipped. A place it cannot take or look at leaves it unordered, as
// without a Queue: the order never costs a lock. A reentrant wait tries
// once before it heeds the queue: an owner holding the lock re-enters at
// once, rather than behind waiters who wait for it.
func (s *LockService) waitTurn(ctx context.Context, ref domain.ResourceRef, timeout time.Duration, reentrant bool,
	try func(notAfter time.Time) (*Handle, error)) (got *Handle, err error) {
	start := s.Now()
	var (
		deadline timer
		notAfter time.Time // the deadline each decision checks; zero: none
	)
	if timeout > 0 {
		deadline = s.after(timeout)
		if s.jumps {
			notAfter = deadline.due // when the timeout's timer fires
		}
	}
	expired := deadline.c
	if s.queue != nil {
		s.waiters.placing.Lock()
	}
	w := s.waiters.join(ref, deadline)
	defer s.waiters.leave(ref, w)

	var (
		place Place
		ahead bool             // at the last look, a live waiter of another process joined before this one
		fresh bool             // ahead was read by Join, just now
		first = s.queue == nil // no waiter of another process can be ahead any more
		// Waiters ahead that leave the lock free for a fallback period
		// each are paused or stuck: they are passed, for one try.
		ticked    bool      // this look follows a fallback timer, not a wake-up
		freeSince time.Time // since when fallback looks found the lock free and a waiter ahead
		passing   bool      // the next try passes the waiters ahead
	)
	defer func() {
		switch {
		case place == nil:
		case err == nil:
			place.Leave(true) // before the caller can release: the next must not find it ahead
		default:
			// A waiter that gives up returns at once: a store that does not
			// answer must not hold it past its deadline for a place it leaves.
			go place.Leave(false)
		}
	}()
	if !first {
		if p, a, err := s.queue.Join(ctx, ref); err == nil {
			place, ahead, fresh = p, a, true
		} else {
			first = true // no place: on without the order, as without a Queue
		}
		s.waiters.placing.Unlock()
	}

	var last *domain.LockConflictError
	gaveUp := func(cause error) (*Handle, error) {
		if last == nil {
			return nil, cause
		}
		c := *last
		c.Waited, c.Cause = s.Now().Sub(start), cause
		return nil, &c
	}
	select {
	case <-w.wake:
	case <-ctx.Done():
		return gaveUp(ctx.Err())
	case <-expired:
		s.waiters.unpark(w) // awake: it reads the store
		return s.queuedOut(ctx, ref, start)
	case <-s.gate.closing:
		return nil, domain.ErrClosed
	}
	var (
		backoff = waitBackoffMin
		news    <-chan struct{} // wake-ups from other processes, once watching
		watched bool            // Watch was called (news may still be nil)
		// woken by another goroutine: a clock move may land while it looks.
		woken = true
	)
	for {
		if d := s.waiters.yielding(ref, time.Now()); d > 0 {
			// Another process waited as we released ref: it goes first (freed).
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return gaveUp(ctx.Err())
			case <-expired:
				return gaveUp(context.DeadlineExceeded)
			case <-s.gate.closing:
				return nil, domain.ErrClosed
			}
		}
		select {
		case <-expired:
			// Timed out while waking: end before a look finds the lock free.
			if last == nil {
				s.waiters.unpark(w)
				return s.queuedOut(ctx, ref, start)
			}
			return gaveUp(context.DeadlineExceeded)
		default:
		}
		if place != nil && !first {
			switch {
			case fresh:
			case ticked && s.heldByAnyone(ctx, ref):
				// Nobody can take it: no need to read the queue (one read a look).
				freeSince = time.Time{}
			default:
				n, err := place.Ahead(ctx)
				ahead = err == nil && n > 0 // a failed look: on without the order
				if ahead && ticked {
					// A fallback period for each waiter ahead: the live ones
					// behind a stuck one pass it in their order.
					if freeSince.IsZero() {
						freeSince = s.Now()
					}
					passing = s.Now().Sub(freeSince) >= time.Duration(n)*waitFallback
				}
			}
			fresh, ticked = false, false
			first = !ahead // later places never come before it
		}
		if place != nil && ahead && !reentrant && !passing {
			if !watched {
				// Watch, and look again: the earlier waiter may have left before the watch.
				watched = true
				c, stop := s.wakeups.Watch(ref)
				defer stop()
				if news = c; news != nil {
					continue
				}
			}
			pause := jittered(waitFallback)
			if news == nil {
				pause = jittered(backoff)
				backoff = min(2*backoff, waitBackoffMax)
			}
			slept := s.after(pause)
			s.waiters.mu.Lock()
			w.setParked(news, slept, deadline)
			s.waiters.mu.Unlock()
			select {
			case <-w.wake:
				backoff = waitBackoffMin
			case <-news:
				backoff = waitBackoffMin
			case <-slept.c:
				ticked = true
			case <-ctx.Done():
				return gaveUp(ctx.Err())
			case <-expired:
				s.waiters.unpark(w)
				if last == nil {
					return s.queuedOut(ctx, ref, start)
				}
				return gaveUp(context.DeadlineExceeded)
			case <-s.gate.closing:
				return nil, domain.ErrClosed
			}
			s.waiters.unpark(w)
			continue
		}
		passing, freeSince = false, time.Time{}
		var lookedAt time.Time
		if s.jumps {
			lookedAt = s.waiters.now()
		}
		h, err := try(notAfter)
		reentrant = false // tried once
		if errors.Is(err, errDeadline) {
			if last == nil {
				return s.queuedOut(ctx, ref, start) // names the holder, if any
			}
			return gaveUp(context.DeadlineExceeded)
		}
		if late := (*domain.LockExpiredError)(nil); errors.As(err, &late) && !late.WrittenAt.IsZero() && ctx.Err() == nil {
			// The lock was written after its TTL and lapsed unused: again.
			select {
			case <-expired:
				return gaveUp(context.DeadlineExceeded)
			case <-s.gate.closing:
				return nil, domain.ErrClosed
			default:
				continue
			}
		}
		if !errors.As(err, &last) {
			if err != nil && ctx.Err() != nil {
				return gaveUp(err)
			}
			return h, err
		}
		if !watched && !last.InProcess && s.wakeups != nil {
			// Watch, and look again: the release may predate the watch (nil: poll).
			watched = true
			c, stop := s.wakeups.Watch(ref)
			defer stop()
			if news = c; news != nil {
				continue
			}
		}
		left := last.Holder.ExpiresAt.Sub(last.Now)
		if last.RowHeld || left <= 0 {
			// A transaction of the holder's holds its row: nothing to wake us.
			left = waitBackoffMax
		} else {
			left = max(min(left, s.until(last.Holder.ExpiresAt)), 0) // last.Now is rounded down
		}
		pause := left // a handle of this service: its release wakes us
		switch {
		case last.InProcess:
		case news != nil:
			// Still read now and then, in case a wake-up was lost.
			pause = min(jittered(waitFallback), left)
		default:
			pause = min(jittered(backoff), left)
			backoff = min(2*backoff, waitBackoffMax)
		}
		slept := s.after(pause)
		if woken && s.jumps && (slept.moved || slept.due.Add(-pause).After(lookedAt)) {
			// The clock moved since the look, maybe to reach us: look again, once.
			woken = false
			continue
		}
		woken = false
		s.waiters.mu.Lock()
		w.setParked(news, slept, deadline)
		s.waiters.mu.Unlock()
		select {
		case <-w.wake:
			backoff = waitBackoffMin // released here: the next holder may be quick too
			woken = true
		case <-news:
			backoff = waitBackoffMin
			woken = true
		case <-slept.c:
		case <-ctx.Done():
			return gaveUp(ctx.Err())
		case <-expired:
			return gaveUp(context.DeadlineExceeded)
		case <-s.gate.closing:
			return nil, domain.ErrClosed
		}
		s.waiters.unpark(w)
	}
}

// jittered returns a random pause in [d/2, d]: processes do not retry in step.
func jittered(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// heldByAnyone reports whether ref has an active lock; a failed read
// counts as held, so that it never passes a waiter ahead.
func (s *LockService) heldByAnyone(ctx context.Context, ref domain.ResourceRef) bool {
	l, err := s.repo.Get(ctx, ref)
	if errors.Is(err, domain.ErrNotFound) {
		return false
	}
	return err != nil || !l.ExpiredAt(s.Now())
}

// queuedOut answers a waiter timed out behind others: the holder, or the timeout.
func (s *LockService) queuedOut(ctx context.Context, ref domain.ResourceRef, start time.Time) (*Handle, error) {
	l, err := s.Get(ctx, ref)
	now := s.Now()
	switch {
	case err == nil && !l.ExpiredAt(now):
		return nil, &domain.LockConflictError{Holder: l, Now: now, Waited: now.Sub(start), Cause: context.DeadlineExceeded}
	case err == nil || errors.Is(err, domain.ErrNotFound):
		return nil, fmt.Errorf("the wait for %s timed out after %s behind earlier waiters, who take the lock first (%w); "+
			"wait longer, or for less contended work", ref, now.Sub(start), context.DeadlineExceeded)
	}
	return nil, errors.Join(context.DeadlineExceeded, err)
}

// AcquireWait is Acquire waiting in Take's queue (opts.Wait), for a Handle's
// lock too, re-entrant per owner, for `agents locks acquire --wait`.
// Errors: those of Acquire and of Take's wait.
func (s *LockService) AcquireWait(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions) (domain.Lock, error) {
	r, err := s.AcquireWaitResult(ctx, owner, ref, opts)
	return r.Lock, err
}

// AcquireWaitResult is AcquireWait, saying whether it re-entered or took over.
func (s *LockService) AcquireWaitResult(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions) (AcquireResult, error) {
	ttl, err := s.checkTake(owner, ref, opts)
	if err != nil {
		return AcquireResult{}, err
	}
	if !opts.Wait {
		return s.acquire(ctx, owner, ref, ttl, opts.Note, DecideAcquire, &Op{Kind: OpAcquire})
	}
	start := s.started()
	var r AcquireResult // of the try that took the lock
	_, err = s.waitTurn(ctx, ref, opts.Timeout, true, func(notAfter time.Time) (*Handle, error) {
		sl, err := s.holders.enter(ctx, ref)
		if err != nil {
			return nil, err
		}
		defer s.holders.leave(ref, sl)
		if held, ok := s.holders.holding(sl, s.Now()); ok {
			return nil, &domain.LockConflictError{Holder: held, Now: s.Now(), InProcess: true}
		}
		decide, one := s.beforeDeadline(DecideAcquire, &Op{Kind: OpAcquire}, notAfter)
		if r, err = s.acquire(ctx, owner, ref, ttl, opts.Note, decide, one); err != nil {
			return nil, err
		}
		return &Handle{svc: s, ttl: ttl, lock: r.Lock}, nil // never a holder: only its lock is returned
	})
	if err != nil {
		r = AcquireResult{}
	}
	s.observeWait(ctx, owner, ref, start, r.Lock, err)
	return r, err
}
