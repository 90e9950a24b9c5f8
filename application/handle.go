package application

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cleveragents/locks/domain"
)

// AcquireOptions tune Take and Do. The zero value takes the lock for the
// default TTL, without waiting.
type AcquireOptions struct {
	// TTL is the lock's time to live; zero means the service's default.
	TTL time.Duration
	// Wait makes the call wait while another owner, or another handle of
	// this service, holds the lock, instead of failing at once with a
	// *domain.LockConflictError. The wait ends with the lock, or when ctx
	// ends, Timeout passes or the service closes. Waiters of one service
	// take the lock in arrival order, and are woken as soon as it is
	// released through the same service; a release by another process is
	// noticed by polling, with a jittered backoff that never sleeps past
	// the holder's expiry.
	Wait bool
	// Timeout bounds a wait on the service's clock; zero leaves it to ctx.
	// It needs Wait: a Timeout without Wait is a *domain.ValidationError,
	// as in the CLI (--timeout without --wait).
	Timeout time.Duration
	// Reentrant lets a Take made inside the work of a handle that holds the
	// same resource (its context comes from that handle's KeepAlive, or
	// from Do) re-enter it, at once: the new handle shares the holder's
	// acquisition (its token) and its Release leaves the lock to the
	// holder. Without it, such a Take is refused at once with a
	// *domain.LockConflictError whose Nested is set: waiting would wait
	// for itself. It has no effect on a Take from anywhere else: another
	// handle is another acquisition, and waits or is refused.
	Reentrant bool
}

// Handle is one acquisition of a lock: it renews, keeps alive, checks and
// releases that acquisition, by its token, without the caller repeating
// the owner and the resource. It is safe for concurrent use.
//
// A handle never acts for another acquisition, even of the same owner: a
// renewal that finds another token or no lock is a loss
// (*domain.LockLostError), and so is a release that removes nothing. Two
// handles of one service are never held at once on one resource, whatever
// their owners (see Take); the owner-scoped Acquire, Renew and Release
// stay re-entrant per owner, as the spec says.
type Handle struct {
	svc *LockService
	ttl time.Duration
	// parent is the handle a re-entry shares its acquisition with (see
	// AcquireOptions.Reentrant); nil for an acquisition of its own.
	parent *Handle

	mu       sync.Mutex
	lock     domain.Lock
	released bool
	lost     *domain.LockLostError // the loss, once the handle learns of it
	keeper   *keeper               // nil until KeepAlive
}

// Take acquires the lock on ref for owner, waiting for it if opts.Wait,
// and returns its handle: one acquisition, with its own token.
//
// A resource that another handle of this service holds (until it is
// released, lost or past its expiry) is not re-entered, even by the same
// owner: a Take waits for it (opts.Wait, in the same queue as the waiters
// for another owner's lock, woken when that handle lets go) or is refused
// at once with a *domain.LockConflictError whose InProcess is set. A Take
// made inside that handle's own work (ctx from its KeepAlive or Do)
// re-enters it with opts.Reentrant, and is otherwise refused at once,
// with Nested set.
//
// Errors: *domain.ValidationError for bad input (a Timeout without Wait
// too); those of Acquire; a wait that ends without the lock returns the
// last *domain.LockConflictError it saw, with Waited and Cause set (or the
// context's error if it never got to try, queued behind other waiters);
// domain.ErrClosed when the service closes meanwhile; for a re-entry, the
// *domain.LockLostError of the lock it would share.
func (s *LockService) Take(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions) (*Handle, error) {
	ttl, err := s.checkTake(owner, ref, opts)
	if err != nil {
		return nil, err
	}
	if outer := s.nestedIn(ctx, ref); outer != nil {
		return s.reenter(ctx, outer, owner, ttl, opts)
	}
	if !opts.Wait {
		return s.takeOnce(ctx, owner, ref, ttl)
	}
	var start time.Time
	if s.observer != nil {
		start = s.clock.Now()
	}
	h, err := s.acquireWaiting(ctx, owner, ref, ttl, opts.Timeout)
	if s.observer != nil && !errors.Is(err, domain.ErrClosed) {
		var l domain.Lock
		if h != nil {
			l = h.Lock()
		}
		s.observer.Observe(ctx, Event{Kind: EventWaited, Owner: owner, Resource: ref, Lock: l,
			Took: s.clock.Now().Sub(start), Err: err})
	}
	return h, err
}

// checkTake validates a Take and returns the TTL to use.
func (s *LockService) checkTake(owner string, ref domain.ResourceRef, opts AcquireOptions) (time.Duration, error) {
	ttl, err := s.checkInput(owner, ref, opts.TTL)
	if err != nil {
		return 0, err
	}
	switch {
	case opts.Timeout < 0:
		return 0, &domain.ValidationError{Field: "timeout", Reason: "must not be negative; pass zero to wait as long as the context allows"}
	case opts.Timeout > 0 && !opts.Wait:
		return 0, &domain.ValidationError{Field: "timeout", Reason: "bounds a wait: set Wait with it, or leave it zero to fail at once when the lock is held"}
	}
	return ttl, nil
}

// takeOnce tries once: refused at once when another handle of this
// service holds ref, otherwise Acquire decides. The check and the
// acquisition run in ref's turn, so that two Takes never both find ref
// free of handles.
func (s *LockService) takeOnce(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration) (*Handle, error) {
	sl, err := s.holders.enter(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer s.holders.leave(ref, sl)
	now := s.Now()
	if l, ok := s.holders.holding(sl, now); ok {
		return nil, &domain.LockConflictError{Holder: l, Now: now, InProcess: true}
	}
	prev := s.holders.unreleased(sl)
	if prev != nil && prev.Err() == nil {
		// A handle past its expiry as it knew it, neither released nor
		// lost: if its owner renewed its lock behind its back, it still
		// holds it, and the store would let this Take re-enter it (share
		// its token). Ask the store, without extending anything.
		if cur, err := s.Get(ctx, ref); err == nil && cur.Token == prev.Lock().Token && !cur.ExpiredAt(s.Now()) {
			prev.extended(cur)
			return nil, &domain.LockConflictError{Holder: cur, Now: s.Now(), InProcess: true}
		}
	}
	l, err := s.Acquire(ctx, owner, ref, ttl)
	if err != nil {
		return nil, err
	}
	if prev != nil && prev.Err() == nil && prev.Lock().Token == l.Token {
		// Renewed in between: the same, caught after the fact.
		prev.extended(l)
		return nil, &domain.LockConflictError{Holder: l, Now: s.Now(), InProcess: true}
	}
	h := &Handle{svc: s, ttl: ttl, lock: l}
	s.holders.hold(sl, h)
	return h, nil
}

// Lock returns the lock as last acquired or renewed. Its token never
// changes.
func (h *Handle) Lock() domain.Lock {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lock
}

// TTL returns the TTL the handle acquires and renews with.
func (h *Handle) TTL() time.Duration { return h.ttl }

// holds returns the lock if the handle holds it at now as far as it
// knows: not lost, not past its expiry. A handle being released still
// holds it until the store has removed it and its slot is vacated: a Take
// of the same owner in between would re-enter its lock in the store, and
// lose it to the release.
func (h *Handle) holds(now time.Time) (domain.Lock, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lock, h.lost == nil && !h.lock.ExpiredAt(now)
}

// extended records l, the handle's own lock with a later expiry.
func (h *Handle) extended(l domain.Lock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l.Token == h.lock.Token && l.ExpiresAt.After(h.lock.ExpiresAt) {
		h.lock = l
	}
}

func (h *Handle) isReleased() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.released
}

// noteLost records the loss, once, and lets the service's waiters for
// the resource try at once.
func (h *Handle) noteLost(lost *domain.LockLostError) {
	h.mu.Lock()
	first := h.lost == nil
	if first {
		h.lost = lost
	}
	h.mu.Unlock()
	if first {
		h.svc.waiters.wake(lost.Lock.Resource)
	}
}

// Renew extends this acquisition's lock to now+TTL and returns it. It
// renews by token: the same owner's lock with another token is another
// acquisition, never extended or adopted.
//
// Errors: *domain.LockLostError when the lock is no longer this
// handle's (another token holds the resource, its lock has expired or was
// removed), with the reason the store shows, or when the store took longer
// than the TTL to write the renewal (LostStoreFailing); *domain.StoreError
// when the store fails; domain.ErrClosed after Close.
func (h *Handle) Renew(ctx context.Context) (domain.Lock, error) {
	cur := h.Lock()
	l, err := h.svc.renewToken(ctx, cur, h.ttl)
	var lost *domain.LockLostError
	if errors.As(err, &lost) {
		h.noteLost(lost)
	}
	if err != nil {
		return domain.Lock{}, err
	}
	h.mu.Lock()
	if l.Token == h.lock.Token {
		h.lock = l
	}
	h.mu.Unlock()
	return l, nil
}

// Release stops the keep-alive, if any, waits for it to end, and releases
// this acquisition's lock (by token) if it is still active; it reports
// whether it removed it. Another acquisition's lock, of any owner, is
// never touched. A re-entered handle (AcquireOptions.Reentrant) leaves
// the lock to the handle it re-entered, and removes nothing. Releasing
// twice is harmless: the second call reports false and nil.
//
// Errors: the *domain.LockLostError of a lock that was lost (noticed by
// the keep-alive, or found by the release: it removed nothing), with
// false; *domain.StoreError; domain.ErrClosed after Close.
func (h *Handle) Release(ctx context.Context) (bool, error) {
	h.mu.Lock()
	k := h.keeper
	already := h.released
	h.released = true
	h.mu.Unlock()
	if k != nil {
		k.stop()
	}
	if already {
		return false, nil
	}
	defer h.svc.wakeAfter(h)
	if err := h.Err(); err != nil {
		return false, err
	}
	if h.parent != nil {
		return false, h.Lost(ctx)
	}
	ok, err := h.svc.releaseToken(ctx, h.Lock())
	var lost *domain.LockLostError
	if errors.As(err, &lost) {
		h.noteLost(lost)
	}
	return ok, err
}

// wakeAfter frees h's slot and lets the waiters for its resource try.
func (s *LockService) wakeAfter(h *Handle) {
	if h.parent != nil {
		return
	}
	s.holders.vacate(h)
	s.waiters.wake(h.Lock().Resource)
}

// Do takes the lock on ref for owner (waiting if opts.Wait), keeps it
// alive while fn runs, and releases it when fn returns, fails or panics.
// fn's context ends the moment the lock is lost; context.Cause(ctx) is
// then the *domain.LockLostError. After fn returns, Do stops the
// keep-alive and asks the store, by token, whether the lock is still this
// acquisition's: only then does it release it. Otherwise it returns the
// loss, joined with fn's error, and releases nothing: a loss that the
// keep-alive had not noticed yet (a pause, a removal, a takeover while fn
// ran) is returned too. A Take made with fn's context on the same
// resource is nested (see AcquireOptions.Reentrant).
//
// Errors: *domain.ValidationError for a nil fn or bad options, before
// anything is acquired; those of Take, before fn runs; afterwards fn's,
// joined with the loss or the release's error.
func (s *LockService) Do(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions,
	fn func(ctx context.Context, lock domain.Lock) error) (err error) {
	if fn == nil {
		return &domain.ValidationError{Field: "fn", Reason: "must be the function to run under the lock, not nil"}
	}
	h, err := s.Take(ctx, owner, ref, opts)
	if err != nil {
		return err
	}
	held := h.KeepAlive(ctx)
	defer func() {
		p := recover()
		// Release even when ctx has ended: a lock left behind blocks its
		// resource for the whole TTL. The store's own retries and timeouts
		// bound this call.
		_, rerr := h.Release(context.WithoutCancel(ctx))
		switch {
		case errors.Is(rerr, domain.ErrClosed):
			rerr = nil // the container releases the owner's locks itself
		case rerr != nil && errors.Is(err, rerr):
			rerr = nil // fn returned the loss itself
		}
		err = errors.Join(err, rerr)
		if p != nil {
			panic(p)
		}
	}()
	return fn(held, h.Lock())
}
