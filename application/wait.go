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

// Backoff of a waiter polling a lock held by another process: small at
// first, so that a lock released a moment later is taken a moment later,
// doubling up to a cap, so that many waiters do not hammer the store.
const (
	waitBackoffMin = 5 * time.Millisecond
	waitBackoffMax = time.Second
)

// waitQueues holds, per resource, the callers of this service waiting for
// its lock, in arrival order. Only the head of each queue tries the lock;
// a release through this service wakes it at once, one by another process
// is seen by its polling, an expiry by its timer.
type waitQueues struct {
	mu     sync.Mutex
	queues map[domain.ResourceRef][]*waiter
	// yields holds, per resource this service released while another
	// process waited for it, until when its waiters hold back (freed).
	yields map[domain.ResourceRef]time.Time
	// now reads the clock the waiters' timers run on, when the service's
	// clock has timers of its own (a mock clock); nil for real timers.
	now func() time.Time
}

type waiter struct {
	// wake receives when the waiter becomes the head, or when the head
	// should try again at once (an in-process release).
	wake chan struct{}
	// parked is set, under the queues' mutex, while the waiter sleeps with
	// every timer that bounds its sleep already set: from then on, moving
	// the clock reaches it (see Waiting). timers are those timers' channels
	// and due the earliest instant one fires (zero: not known); once the
	// clock reaches due, or a channel holds its time, the waiter is awake,
	// drained or not, until it parks again.
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

// timer is a timer a waiter sleeps on: its channel, the instant it is due
// on its clock, and whether that clock moved while it was set (so that it
// may be due later than due).
type timer struct {
	c     <-chan time.Time
	due   time.Time
	moved bool
}

// after sets a timer of d. Its due instant is read before the timer is
// set, never later than the timer's: a waiter stops counting as parked no
// later than it wakes.
func (s *LockService) after(d time.Duration) timer {
	if s.waiters.now == nil {
		return timer{c: s.timers.After(d)}
	}
	before := s.waiters.now()
	t := timer{c: s.timers.After(d), due: before.Add(d)}
	t.moved = s.jumps && !s.waiters.now().Equal(before) // only a clock that tests move jumps
	return t
}

func newWaitQueues() *waitQueues {
	return &waitQueues{queues: make(map[domain.ResourceRef][]*waiter), yields: make(map[domain.ResourceRef]time.Time)}
}

// setParked records w's timers (nil channels: none) and wake-up channel,
// and marks it parked; q.mu is held.
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

// join queues a new waiter for ref, woken at once if it is the head; one
// behind others is parked on expired, its timeout, set before it queued.
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

func (q *waitQueues) park(w *waiter, news <-chan struct{}, timers ...timer) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.setParked(news, timers...)
}

// unpark marks w as awake (it tries the lock, or computes its next sleep).
func (q *waitQueues) unpark(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.parked = false
}

// leave removes w from ref's queue and, if w was the head, wakes the next.
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

// wake tells the head waiter of ref to try again now.
func (q *waitQueues) wake(ref domain.ResourceRef) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if queue := q.queues[ref]; len(queue) > 0 {
		wakeHead(queue)
	}
}

// wakeAll tells every head waiter to try again now.
func (q *waitQueues) wakeAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, queue := range q.queues {
		wakeHead(queue)
	}
}

// wakeHead wakes queue's head, unless a wake-up is already pending; q.mu is
// held.
func wakeHead(queue []*waiter) {
	queue[0].parked = false
	select {
	case queue[0].wake <- struct{}{}:
	default:
	}
}

// Waiting returns how many callers of this service are waiting for the lock
// on ref, counting a caller only once it is parked: asleep, with every
// timer that bounds its sleep (the holder's expiry, its next look at the
// store, its timeout) already set on the service's clock. So once Waiting
// says a caller waits, moving a mock clock reaches it: a test may wait
// until Waiting(ref) == n and then move the clock past the holder's
// expiry. A caller that is trying the lock or about to sleep again, whose
// timer is due on the service's clock, or that gave up is not counted. A
// caller woken by another goroutine while the clock moves looks again if
// the clock moved during its look, so that the move reaches it; one move
// past both its timeout and the holder's expiry ends its wait as a timeout.
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

// errDeadline is a decision refused because the wait it was made for had
// timed out by then (see beforeDeadline).
var errDeadline = errors.New("the wait timed out before this decision")

// beforeDeadline returns decide, and one, the Op a OneStatement store may
// carry out instead; with a deadline (notAfter non-zero), decide refusing
// every decision made once the clock reads notAfter, and no Op. A waiter on
// a clock that jumps decides so: one move past both its timeout and the
// holder's expiry may land while it looks at the store, and that look must
// not take a lock that came free only after the wait had timed out. The
// clock is read unrounded, so that the refusal starts exactly when the
// timeout's timer fires.
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

// waitTurn queues for ref and, as the head, calls try until it returns
// anything but a *domain.LockConflictError, ctx ends, timeout passes on the
// service's clock (zero: none) or the service closes. A wait that ends
// without the lock returns the last conflict seen, with Waited set; if the
// waiter never got to try (others were ahead), the context's error or
// ErrClosed.
//
// A handle of this service is waited for without polling: its release or
// loss wakes the head, and its expiry as it knows it bounds the sleep. A
// holder in another process is waited for through the service's Wakeups,
// if any (the head still reads the store once per waitFallback and at the
// holder's expiry), or else by polling with a growing backoff.
func (s *LockService) waitTurn(ctx context.Context, ref domain.ResourceRef, timeout time.Duration, try func(notAfter time.Time) (*Handle, error)) (*Handle, error) {
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
	w := s.waiters.join(ref, deadline)
	defer s.waiters.leave(ref, w)

	var last *domain.LockConflictError
	gaveUp := func(cause error) (*Handle, error) {
		if last == nil {
			return nil, cause
		}
		c := *last
		c.Waited, c.Cause = s.Now().Sub(start), cause
		return nil, &c
	}
	// Sleep until this waiter is the head of the queue.
	select {
	case <-w.wake:
	case <-ctx.Done():
		return gaveUp(ctx.Err())
	case <-expired:
		s.waiters.unpark(w) // awake: it reads the store
		// Only the head may take the lock, so the answer comes from a read,
		// which names the holder.
		return s.queuedOut(ctx, ref, start)
	case <-s.gate.done():
		return nil, domain.ErrClosed
	}
	var (
		backoff = waitBackoffMin
		news    <-chan struct{} // wake-ups from other processes, once watching
		watched bool            // Watch was called (news may still be nil)
		// woken: roused by another goroutine, not by its own timers, and
		// not parked since. It may have counted as parked (Waiting) until
		// it woke, so a mock clock move made on the strength of that count
		// may land while it looks.
		woken = true
	)
	for {
		if d := s.waiters.yielding(ref, time.Now()); d > 0 {
			// This service just released ref while another process waited
			// for it: that process goes first (freed). A courtesy, on real
			// time, so that a release hands over on a clock that a test
			// moves; the waiter is not parked meanwhile.
			yielded := time.NewTimer(d)
			select {
			case <-yielded.C:
			case <-ctx.Done():
				yielded.Stop()
				return gaveUp(ctx.Err())
			case <-expired:
				yielded.Stop()
				return gaveUp(context.DeadlineExceeded)
			case <-s.gate.done():
				yielded.Stop()
				return nil, domain.ErrClosed
			}
		}
		select {
		case <-expired:
			// The deadline came while this waiter was waking (one move past
			// both it and the holder's expiry): it ends the wait, as in real
			// time, before a look that could find the lock free.
			if last == nil {
				s.waiters.unpark(w)
				return s.queuedOut(ctx, ref, start)
			}
			return gaveUp(context.DeadlineExceeded)
		default:
		}
		// When this look began on a mock clock, to tell below whether the
		// clock moved before the sleep's timers were set.
		var lookedAt time.Time
		if s.jumps {
			lookedAt = s.waiters.now()
		}
		h, err := try(notAfter)
		if errors.Is(err, errDeadline) {
			if last == nil {
				return s.queuedOut(ctx, ref, start) // names the holder, if any
			}
			return gaveUp(context.DeadlineExceeded)
		}
		if late := (*domain.LockExpiredError)(nil); errors.As(err, &late) && !late.WrittenAt.IsZero() && ctx.Err() == nil {
			// The store took longer than the TTL to write the lock, which
			// lapsed unused: try again, unless timed out or closing.
			select {
			case <-expired:
				return gaveUp(context.DeadlineExceeded)
			case <-s.gate.done():
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
			// Held by another process: watch for its release, and look once
			// more, since it may have come before the watch began. A nil
			// channel means no watch here: poll.
			watched = true
			c, stop := s.wakeups.Watch(ref)
			defer stop()
			if news = c; news != nil {
				continue
			}
		}
		left := last.Holder.ExpiresAt.Sub(last.Now)
		if last.RowHeld || left <= 0 {
			// Expired but a transaction of the holder's holds its row: no
			// expiry to sleep until, and no release will wake us.
			left = waitBackoffMax
		}
		pause := left // a handle of this service: its release wakes us
		switch {
		case last.InProcess:
		case news != nil:
			// The holder's release wakes us; the store is still read now
			// and then, in case a wake-up was lost.
			pause = min(jittered(waitFallback), left)
		default:
			pause = min(jittered(backoff), left)
			backoff = min(2*backoff, waitBackoffMax)
		}
		slept := s.after(pause)
		if woken && s.jumps && (slept.moved || slept.due.Add(-pause).After(lookedAt)) {
			// The clock moved between this look and the timer, maybe to
			// reach this waiter: look again rather than sleep past what the
			// move made due; once, so that a clock that moves by itself does
			// not keep it from sleeping.
			woken = false
			continue
		}
		woken = false
		s.waiters.park(w, news, slept, deadline)
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
		case <-s.gate.done():
			return nil, domain.ErrClosed
		}
		s.waiters.unpark(w)
	}
}

// jittered returns a pause between d/2 and d, at random, so that waiters
// and renewals of several processes do not retry in step.
func jittered(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// queuedOut answers a waiter whose timeout passed while others were ahead
// of it: the holder that a read finds, as the conflict the wait ends with;
// the timeout, if the lock is free (the head takes it).
func (s *LockService) queuedOut(ctx context.Context, ref domain.ResourceRef, start time.Time) (*Handle, error) {
	l, err := s.Get(ctx, ref)
	now := s.Now()
	switch {
	case err == nil && !l.ExpiredAt(now):
		return nil, &domain.LockConflictError{Holder: l, Now: now, Waited: now.Sub(start), Cause: context.DeadlineExceeded}
	case err == nil || errors.Is(err, domain.ErrNotFound):
		return nil, fmt.Errorf("the wait for %s timed out after %s behind earlier waiters of this process, who take the lock first (%w); "+
			"wait longer, or for less contended work", ref, now.Sub(start), context.DeadlineExceeded)
	}
	return nil, errors.Join(context.DeadlineExceeded, err)
}

// AcquireWait is the owner-scoped Acquire, waiting for the lock as Take
// does with opts.Wait (same queue, same polling), for a caller that holds
// its lock by owner rather than by handle, such as `agents locks acquire
// --wait`: re-entrant per owner, as the spec says, which a Take never is.
// opts.Reentrant is ignored. With opts.Wait, a lock that a Handle of this
// service holds is waited for, whatever the handle's owner; without it,
// this is Acquire, which re-enters any active lock of owner's.
//
// Errors: those of Acquire and of Take's wait (a *domain.ValidationError
// for a Timeout without Wait; the last *domain.LockConflictError, with
// Waited and Cause, when the wait ends without the lock).
func (s *LockService) AcquireWait(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions) (domain.Lock, error) {
	r, err := s.AcquireWaitResult(ctx, owner, ref, opts)
	return r.Lock, err
}

// AcquireWaitResult is AcquireWait, and says whether the acquisition
// re-entered the owner's lock or took over a dead holder's. Its errors are
// AcquireWait's.
func (s *LockService) AcquireWaitResult(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions) (AcquireResult, error) {
	ttl, err := s.checkTake(owner, ref, opts)
	if err != nil {
		return AcquireResult{}, err
	}
	if !opts.Wait {
		return s.acquire(ctx, owner, ref, ttl, DecideAcquire, &Op{Kind: OpAcquire})
	}
	start := s.started()
	var r AcquireResult // of the try that took the lock
	_, err = s.waitTurn(ctx, ref, opts.Timeout, func(notAfter time.Time) (*Handle, error) {
		sl, err := s.holders.enter(ctx, ref)
		if err != nil {
			return nil, err
		}
		defer s.holders.leave(ref, sl)
		if held, ok := s.holders.holding(sl, s.Now()); ok {
			// Another acquisition, whatever its owner: its release wakes
			// this waiter, as for a Take.
			return nil, &domain.LockConflictError{Holder: held, Now: s.Now(), InProcess: true}
		}
		decide, one := s.beforeDeadline(DecideAcquire, &Op{Kind: OpAcquire}, notAfter)
		if r, err = s.acquire(ctx, owner, ref, ttl, decide, one); err != nil {
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
