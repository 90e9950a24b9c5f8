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
	// Wait makes the call wait while another owner holds the lock, instead
	// of failing at once with a *domain.LockConflictError. The wait ends
	// with the lock, or when ctx ends, Timeout passes or the service
	// closes. Waiters of one service take the lock in arrival order, and
	// are woken as soon as it is released through the same service;
	// a release by another process is noticed by polling, with a jittered
	// backoff that never sleeps past the holder's expiry.
	Wait bool
	// Timeout bounds a wait on the service's clock; zero leaves it to ctx.
	Timeout time.Duration
}

// Handle is a lock held by one owner: it carries the lock and renews,
// keeps alive and releases it without the caller repeating the owner and
// the resource. It is safe for concurrent use.
//
// Re-entrancy is per owner: two handles of one owner on one resource share
// the lock, and releasing either releases it.
type Handle struct {
	svc *LockService
	ttl time.Duration

	mu       sync.Mutex
	lock     domain.Lock
	released bool
	keeper   *keeper // nil until KeepAlive
}

// Take acquires the lock on ref for owner, waiting for it if opts.Wait,
// and returns its handle.
//
// Errors: those of Acquire; a wait that ends without the lock returns the
// last *domain.LockConflictError it saw, with Waited and Cause set (or the
// context's error if it never got to try, queued behind other waiters);
// domain.ErrClosed when the service closes meanwhile.
func (s *LockService) Take(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions) (*Handle, error) {
	ttl, err := s.checkInput(owner, ref, opts.TTL)
	if err != nil {
		return nil, err
	}
	if opts.Timeout < 0 {
		return nil, &domain.ValidationError{Field: "timeout", Reason: "must not be negative; pass zero to wait as long as the context allows"}
	}
	var l domain.Lock
	if opts.Wait {
		var start time.Time
		if s.observer != nil {
			start = s.clock.Now()
		}
		l, err = s.acquireWaiting(ctx, owner, ref, ttl, opts.Timeout)
		if s.observer != nil && !errors.Is(err, domain.ErrClosed) {
			s.observer.Observe(ctx, Event{Kind: EventWaited, Owner: owner, Resource: ref, Lock: l,
				Took: s.clock.Now().Sub(start), Err: err})
		}
	} else {
		l, err = s.Acquire(ctx, owner, ref, ttl)
	}
	if err != nil {
		return nil, err
	}
	return &Handle{svc: s, ttl: ttl, lock: l}, nil
}

// Lock returns the lock as last acquired or renewed.
func (h *Handle) Lock() domain.Lock {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lock
}

// TTL returns the TTL the handle acquires and renews with.
func (h *Handle) TTL() time.Duration { return h.ttl }

// Renew extends the lock to now+TTL and returns it.
//
// Errors: those of LockService.Renew.
func (h *Handle) Renew(ctx context.Context) (domain.Lock, error) {
	cur := h.Lock()
	l, err := h.svc.Renew(ctx, cur.Owner, cur.Resource, h.ttl)
	if err != nil {
		return domain.Lock{}, err
	}
	h.mu.Lock()
	h.lock = l
	h.mu.Unlock()
	return l, nil
}

// Release stops the keep-alive, if any, waits for it to end, and releases
// the lock if its owner still holds it; it reports whether a lock was
// removed. A lock another owner took over is never touched. Releasing
// twice is harmless.
//
// Errors: those of LockService.Release.
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
	cur := h.Lock()
	return h.svc.release(ctx, cur.Owner, cur.Resource, cur.AcquiredAt)
}

// Do takes the lock on ref for owner (waiting if opts.Wait), keeps it
// alive while fn runs, and releases it when fn returns, fails or panics.
// fn's context ends the moment the lock is lost; context.Cause(ctx) is
// then the *domain.LockLostError. Do returns fn's error joined with the
// loss, if the lock was lost, and with the release's error, if any.
//
// Errors: those of Take, before fn runs; afterwards fn's, joined as said.
func (s *LockService) Do(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions,
	fn func(ctx context.Context, lock domain.Lock) error) (err error) {
	h, err := s.Take(ctx, owner, ref, opts)
	if err != nil {
		return err
	}
	held := h.KeepAlive(ctx)
	defer func() {
		p := recover()
		lost := h.Err()
		// Release even when ctx has ended: a lock left behind blocks its
		// resource for the whole TTL. The store's own retries and timeouts
		// bound this call.
		_, rerr := h.Release(context.WithoutCancel(ctx))
		if errors.Is(rerr, domain.ErrClosed) {
			rerr = nil // the container releases the owner's locks itself
		}
		err = errors.Join(err, lost, rerr)
		if p != nil {
			panic(p)
		}
	}()
	return fn(held, h.Lock())
}
