package application

import (
	"context"
	"errors"
	"time"

	"github.com/cleveragents/locks/domain"
)

// Backoff of a renewal after a transient failure, never past the expiry.
const (
	renewBackoffMin = 50 * time.Millisecond
	renewBackoffMax = 2 * time.Second
)

var (
	errRenewTooSlow = errors.New("the renewal had not completed when the lock expired")
	errReleased     = errors.New("the lock was released")
)

// keeper renews one handle's lock in the background.
type keeper struct {
	h          *Handle
	run        context.Context // bounds the goroutine and every renewal
	stopRun    context.CancelFunc
	held       context.Context // the caller's context, ending with the loss as its cause
	cancelHeld context.CancelCauseFunc
	done       chan struct{}
	follower   bool // a re-entry's: renews nothing, ends with its outer handle's
	// news: wake-ups from other processes on the resource (watch); poke:
	// this service's removal or takeover of it. Either makes it look.
	news    <-chan struct{}
	unwatch func()
	poke    chan struct{}
}

// KeepAlive renews the lock by token every domain.RenewInterval(TTL) until
// release or ctx's end, and returns a context that ends when the lock is
// lost, with the *domain.LockLostError as cause. Transient failures are
// retried until the expiry; a permanent one (domain.IsPermanent) ends the
// hold. A re-entry's keep-alive ends with its outer one; a second call
// returns the same context.
func (h *Handle) KeepAlive(ctx context.Context) context.Context {
	h.mu.Lock()
	if h.keeper != nil {
		defer h.mu.Unlock()
		return h.keeper.held
	}
	k := &keeper{h: h, done: make(chan struct{}), poke: make(chan struct{}, 1)}
	k.run, k.stopRun = context.WithCancel(ctx)
	k.held, k.cancelHeld = context.WithCancelCause(withHeld(ctx, h))
	h.keeper = k
	released := h.released
	h.mu.Unlock()
	h.root().follow(k) // a loss, however learned, ends k.held
	switch {
	case released:
		k.end(errReleased)
	case h.parent != nil:
		k.shadow(h.parent)
	case h.Err() != nil:
		k.end(h.Err())
	case h.svc.gate.keep() != nil:
		h.noteLost(&domain.LockLostError{Lock: h.Lock(), Reason: domain.LostClosed, At: h.svc.Now()})
		k.end(h.Err())
	default:
		// Watching from now: a removal or takeover found later is news.
		k.news, k.unwatch = k.watch()
		// The first wait is measured now, not when the goroutine runs.
		go k.loop(k.nextRenewal())
	}
	return k.held
}

// end ends a keep-alive that never started, with cause.
func (k *keeper) end(cause error) {
	k.cancelHeld(cause)
	k.stopRun()
	close(k.done)
}

// shadow is a re-entry's keep-alive: it ends with outer's.
func (k *keeper) shadow(outer *Handle) {
	k.follower = true
	stop := func() bool { return false }
	outer.mu.Lock()
	if ok := outer.keeper; ok != nil {
		stop = context.AfterFunc(ok.held, func() { k.cancelHeld(context.Cause(ok.held)) })
	}
	outer.mu.Unlock()
	context.AfterFunc(k.held, func() {
		stop()
		k.stopRun()
		close(k.done)
	})
}

// Done is closed when the keep-alive has ended; nil before KeepAlive.
func (h *Handle) Done() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keeper == nil {
		return nil
	}
	return h.keeper.done
}

// Err returns the *domain.LockLostError once h has learned of its loss.
func (h *Handle) Err() error {
	r := h.root()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost == nil {
		return nil
	}
	return r.lost
}

// stop ends the renewals and waits; a re-entry's context ends now.
func (k *keeper) stop() {
	k.stopRun()
	if k.follower {
		k.cancelHeld(errReleased)
		<-k.done
		k.h.root().unfollow(k)
		return
	}
	<-k.done
}

func (k *keeper) loop(wait time.Duration) {
	svc := k.h.svc
	defer svc.gate.unkeep()
	defer close(k.done)
	defer k.unwatch() // before done: a Release writes once nothing watches for it
	var (
		pace  pacer
		paced <-chan time.Time // a look that pace put off
	)
	for ; ; wait = k.nextRenewal() {
		renewal := svc.timers.After(wait)
	waiting:
		for {
			select {
			case <-renewal:
				break waiting
			case <-k.news:
			case <-k.poke:
			case <-paced:
				paced = nil
				pace.take(svc.clock.Now())
				held, due := k.look(renewal)
				if !held {
					return
				}
				if due {
					break waiting
				}
				continue
			case <-k.run.Done():
				return
			case <-k.held.Done():
				return // lost, as learned elsewhere
			case <-svc.gate.closing:
				k.lose(domain.LockLostError{Lock: k.h.Lock(), Reason: domain.LostClosed})
				return
			}
			if paced != nil {
				continue // a look is due already
			}
			if d := pace.take(svc.clock.Now()); d > 0 {
				paced = svc.timers.After(d)
				continue
			}
			held, due := k.look(renewal)
			if !held {
				return
			}
			if due {
				break waiting
			}
		}
		paced = nil // the renewal reads the row too
		if !k.renew() {
			return
		}
	}
}

// nextRenewal is TTL/2, or half of what is left (a late acquisition), so
// that the renewal that declares the loss at the expiry starts before it.
func (k *keeper) nextRenewal() time.Duration {
	wait := domain.RenewInterval(k.h.ttl)
	if left := k.h.svc.until(k.h.Lock().ExpiresAt); left < wait {
		wait = max(left/2, 0)
	}
	return wait
}

// renew renews until the expiry and reports whether the lock is still held.
func (k *keeper) renew() bool {
	svc := k.h.svc
	l := k.h.Lock()
	backoff := renewBackoffMin
	var last error
	for {
		now := svc.Now()
		if l.ExpiredAt(now) {
			k.lose(k.lostAt(l, last))
			return false
		}
		err := k.renewBefore(l)
		var lost *domain.LockLostError
		switch {
		case err == nil:
			return true
		case k.run.Err() != nil:
			return false // released, or the caller's context ended
		case errors.As(err, &lost) && lost.Reason != domain.LostStoreFailing:
			k.lose(*lost) // the store shows another token, or none, or its expiry
			return false
		case errors.Is(err, domain.ErrClosed):
			k.lose(domain.LockLostError{Lock: l, Reason: domain.LostClosed})
			return false
		case domain.IsPermanent(err):
			// No retry helps; the database's name may now lock another file.
			k.lose(domain.LockLostError{Lock: l, Reason: domain.LostStoreFailing, Err: err})
			return false
		}
		last = err
		pause := jittered(backoff)
		if left := svc.until(l.ExpiresAt); left < pause {
			pause = left
		}
		backoff = min(2*backoff, renewBackoffMax)
		select {
		case <-svc.timers.After(pause):
		case <-k.run.Done():
			return false
		case <-k.held.Done():
			return false
		case <-svc.gate.closing:
			k.lose(domain.LockLostError{Lock: l, Reason: domain.LostClosed})
			return false
		}
	}
}

// renewBefore runs one renewal, abandoned at l's expiry.
func (k *keeper) renewBefore(l domain.Lock) error {
	svc := k.h.svc
	ctx, cancel := context.WithCancelCause(k.run)
	defer cancel(nil)
	// Set here, not in the goroutine: a test's mock clock sees the timers in order.
	deadline := svc.timers.After(svc.until(l.ExpiresAt))
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-deadline:
			cancel(errRenewTooSlow)
		case <-svc.gate.closing:
			// Close waits for us: never for a store that does not answer.
			cancel(domain.ErrClosed)
		case <-finished:
		}
	}()
	_, err := k.h.Renew(ctx)
	if err != nil {
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, errRenewTooSlow):
			return errRenewTooSlow
		case errors.Is(cause, domain.ErrClosed):
			return domain.ErrClosed
		}
	}
	return err
}

// lostAt explains the loss of l at its expiry.
func (k *keeper) lostAt(l domain.Lock, last error) domain.LockLostError {
	if last != nil {
		var slow *domain.LockLostError
		if errors.As(last, &slow) && slow.Err != nil {
			last = slow.Err // a renewal written too late: its own words
		}
		return domain.LockLostError{Lock: l, Reason: domain.LostStoreFailing, Err: last}
	}
	_, lost, _ := k.h.svc.explainLoss(k.run, l)
	if lost == nil { // the store still shows it: it has expired all the same
		lost = &domain.LockLostError{Lock: l, Reason: domain.LostExpired}
	}
	return *lost
}

// Lost returns the handle's *domain.LockLostError, known or found by a read
// now, or nil; after a release, an error matching domain.ErrExpired.
func (h *Handle) Lost(ctx context.Context) error {
	var known *domain.LockLostError
	if errors.As(h.Err(), &known) && known.Reason != domain.LostExpired {
		return known
	}
	if known == nil && h.root().isReleased() {
		return h.errReleased("check") // given up, not lost, and no longer held
	}
	_, lost, _ := h.svc.explainLoss(ctx, h.Lock())
	switch {
	case lost != nil:
		return h.lossOrReleased(lost, "check")
	case known != nil:
		return known
	}
	return nil
}

// lose records the loss and ends the caller's context with it.
func (k *keeper) lose(e domain.LockLostError) {
	e.At = k.h.svc.Now()
	if !k.h.noteLost(&e) {
		k.cancelHeld(errReleased)
		return
	}
	k.cancelHeld(k.h.Err())
}
