package application

import (
	"context"
	"errors"
	"fmt"
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
	// *domain.LockConflictError, until it gets the lock, ctx ends, Timeout
	// passes or the service closes. Waiters of one service take the lock in
	// arrival order, woken as soon as it is released through the service; a
	// release by another process is noticed by polling, with a jittered
	// backoff that never sleeps past the holder's expiry.
	Wait bool
	// Timeout bounds a wait on the service's clock; zero leaves it to ctx.
	// A Timeout without Wait is a *domain.ValidationError, as in the CLI.
	Timeout time.Duration
	// Reentrant lets a Take made inside the work of a handle holding the
	// same resource (its context comes from that handle's KeepAlive, or
	// from Do) re-enter it at once: the new handle shares the holder's
	// token, never moves the lock's expiry (so a shorter TTL never shortens
	// the holder's lock), and its Release leaves the lock to the holder.
	// Without it, such a Take is refused at once with a
	// *domain.LockConflictError whose Nested is set: waiting would wait for
	// itself. A Take from anywhere else is another acquisition.
	Reentrant bool
}

// Handle is one acquisition of a lock: it renews, keeps alive, checks and
// releases that acquisition by its token. It is safe for concurrent use.
//
// A handle never acts for another acquisition, even of the same owner: a
// renewal that finds another token or no lock is a loss
// (*domain.LockLostError), and so is a release that removes nothing. Two
// handles of one service are never held at once on one resource, whatever
// their owners (see Take); the owner-scoped Acquire, Renew and Release
// stay re-entrant per owner, as the spec says.
type Handle struct {
	svc    *LockService
	ttl    time.Duration
	parent *Handle // the handle a re-entry shares its acquisition with

	releasing sync.Mutex // one Release at a time: a failed one may be retried

	mu        sync.Mutex
	lock      domain.Lock
	released  bool
	dropping  bool                  // its release is removing the lock
	attempted bool                  // a release failed, and may have removed it
	lost      *domain.LockLostError // the loss, once the handle learns of it
	keeper    *keeper               // nil until KeepAlive
	// followers are the keep-alives (its own and its re-entries') whose
	// contexts end with this acquisition.
	followers map[*keeper]struct{}
}

// Take acquires the lock on ref for owner, waiting for it if opts.Wait,
// and returns its handle: one acquisition, with its own token.
//
// A resource that another handle of this service holds (until it is
// released, lost or past its expiry) is not re-entered, even by the same
// owner: a Take waits for it (in the same queue as for another owner's
// lock) or is refused at once with a *domain.LockConflictError whose
// InProcess is set. A Take made inside that handle's own work re-enters it
// with opts.Reentrant, and is otherwise refused at once, with Nested set.
// Nor does a Take share a lock it finds in the store: an active lock of any
// owner refuses it (DecideTake), with SameOwner set for the caller's own.
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
		return s.takeOnce(ctx, owner, ref, ttl, time.Time{})
	}
	start := s.started()
	h, err := s.waitTurn(ctx, ref, opts.Timeout, func(notAfter time.Time) (*Handle, error) {
		return s.takeOnce(ctx, owner, ref, ttl, notAfter)
	})
	var l domain.Lock
	if h != nil {
		l = h.Lock()
	}
	s.observeWait(ctx, owner, ref, start, l, err)
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

// takeOnce tries once, in ref's turn so that two Takes never both find ref
// free of handles: refused at once when a handle of this service holds ref,
// otherwise decided by the store by DecideTake, which never shares a lock
// it finds active (a handle whose release failed, or whose loss was
// declared while its renewal committed, still has its row there).
func (s *LockService) takeOnce(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration, notAfter time.Time) (*Handle, error) {
	sl, err := s.holders.enter(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer s.holders.leave(ref, sl)
	now := s.Now()
	if l, ok := s.holders.holding(sl, now); ok {
		return nil, &domain.LockConflictError{Holder: l, Now: now, InProcess: true}
	}
	decide, one := s.beforeDeadline(DecideTake, &Op{Kind: OpTake}, notAfter)
	r, err := s.acquire(ctx, owner, ref, ttl, decide, one)
	var conflict *domain.LockConflictError
	if errors.As(err, &conflict) && s.holders.holdsToken(sl, conflict.Holder.Token) {
		// The store's holder is this service's handle, renewed past its
		// expiry as it knew it: a waiter waits for its release, not polls.
		conflict.InProcess = true
	}
	if err != nil {
		return nil, err
	}
	h := &Handle{svc: s, ttl: ttl, lock: r.Lock}
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

// holds returns the lock if the handle holds it at now as far as it knows:
// not lost, not past its expiry. A handle being released, or whose release
// failed, still holds it: the store may still have it.
func (h *Handle) holds(now time.Time) (domain.Lock, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lock, h.lost == nil && !h.lock.ExpiredAt(now)
}

func (h *Handle) isReleased() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.released
}

// root returns the handle whose acquisition h stands for.
func (h *Handle) root() *Handle {
	if h.parent != nil {
		return h.parent
	}
	return h
}

// noteLost is the one place where a handle learns of its loss, whoever
// found it: it records the loss once, on the root handle, ends every
// following keep-alive's context with it, and lets the waiters for the
// resource try at once. It reports false, and does nothing, once the
// acquisition is released or while its release is being written.
func (h *Handle) noteLost(lost *domain.LockLostError) (recorded bool) {
	r := h.root()
	r.mu.Lock()
	// A released acquisition was given up, not lost; while its release is
	// written, only the release knows whether a read saw its own removal.
	givenUp := r.lost == nil && (r.released || r.dropping)
	first := r.lost == nil && !givenUp
	var followers map[*keeper]struct{}
	if first {
		r.lost, followers, r.followers = lost, r.followers, nil
	}
	r.mu.Unlock()
	if !first {
		return !givenUp
	}
	for k := range followers {
		k.cancelHeld(lost)
	}
	r.svc.waiters.wake(lost.Lock.Resource)
	return true
}

func (h *Handle) setDropping(on bool) {
	h.mu.Lock()
	h.dropping = on
	h.mu.Unlock()
}

// follow makes k's context end with h's acquisition, lost or released,
// at once if that has already happened.
func (h *Handle) follow(k *keeper) {
	h.mu.Lock()
	lost, released := h.lost, h.released
	if lost == nil && !released {
		if h.followers == nil {
			h.followers = make(map[*keeper]struct{})
		}
		h.followers[k] = struct{}{}
	}
	h.mu.Unlock()
	switch {
	case lost != nil:
		k.cancelHeld(lost)
	case released:
		k.cancelHeld(errReleased)
	}
}

func (h *Handle) unfollow(k *keeper) {
	h.mu.Lock()
	delete(h.followers, k)
	h.mu.Unlock()
}

// Renew extends this acquisition's lock to now+TTL, by token, and returns
// it. A re-entered handle (AcquireOptions.Reentrant) never moves the
// expiry: its Renew checks by token that the shared lock is still held and
// returns it as stored. A loss it finds ends the keep-alive contexts of
// the acquisition, as the keep-alive's own would.
//
// Errors: *domain.LockLostError when the lock is no longer this handle's
// (another token holds the resource, it expired or was removed), with the
// reason the store shows, or when the store took longer than the TTL to
// write the renewal (LostStoreFailing); an error matching
// domain.ErrExpired, and no loss, after the handle's own release;
// *domain.StoreError when the store fails; domain.ErrClosed after Close.
func (h *Handle) Renew(ctx context.Context) (domain.Lock, error) {
	if err := h.Err(); err != nil {
		return domain.Lock{}, err
	}
	if h.root().isReleased() {
		return domain.Lock{}, h.errReleased("renew")
	}
	var (
		l   domain.Lock
		err error
	)
	if h.parent != nil {
		var lost *domain.LockLostError
		if l, lost, err = h.svc.explainLoss(ctx, h.parent.Lock()); lost != nil {
			err = lost
		}
	} else {
		l, err = h.svc.renewToken(ctx, h.Lock(), h.ttl)
	}
	var lost *domain.LockLostError
	if errors.As(err, &lost) {
		err = h.lossOrReleased(lost, "renew")
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

// renewToken renews held, a handle's acquisition, by its token
// (OpRenewToken), never through an owner-scoped write.
func (s *LockService) renewToken(ctx context.Context, held domain.Lock, ttl time.Duration) (domain.Lock, error) {
	op := Op{Kind: OpRenewToken, Owner: held.Owner, Ref: held.Resource, Held: held}
	out, err := s.apply(ctx, held.Owner, held.Resource, ttl, op.Decide, &op)
	err = lateRenewal(held, err)
	if err == nil && out.Lock.Token != held.Token {
		// A store that broke its contract: never adopt the token.
		err = &domain.StoreError{Op: "renew lock on " + held.Resource.String(),
			Err: fmt.Errorf("renewed token %d for a handle of token %d", out.Lock.Token, held.Token)}
	}
	s.observeRenewal(ctx, held.Owner, held.Resource, out.Lock, err)
	if err != nil {
		return domain.Lock{}, err
	}
	return out.Lock, nil
}

// explainLoss reads held's resource and says whether, and why, held is
// lost now (lossOnRead), with the lock stored: nil while the store still
// shows held active, or cannot be read before held's expiry (its error).
func (s *LockService) explainLoss(ctx context.Context, held domain.Lock) (domain.Lock, *domain.LockLostError, error) {
	if err := s.gate.enter(); err != nil {
		return domain.Lock{}, nil, err
	}
	defer s.gate.leave()
	cur, err := s.repo.Get(ctx, held.Resource)
	lost, err := lossOnRead(held, cur, err, s.Now())
	return cur, lost, err
}

// Release stops the keep-alive, if any, waits for it to end, and releases
// this acquisition's lock (by token) if it is still active; it reports
// whether it removed it. A re-entered handle leaves the lock to the handle
// it re-entered. Releasing twice is harmless: the second call reports
// false and nil.
//
// A release that the store failed, or that its context cancelled, leaves
// the handle holding its place in this service (no other handle here takes
// the resource until its expiry), its keep-alive stopped, and the lock
// maybe stored: call Release again. A retry that finds no lock at all
// reports false and nil (the failed attempt may have removed it).
//
// Errors: the *domain.LockLostError of a lock that was lost (noticed by
// the keep-alive, or found by the release: it removed nothing), with
// false; *domain.StoreError or the context's error, with false, when the
// release may not have happened (retry it); domain.ErrClosed after Close.
func (h *Handle) Release(ctx context.Context) (bool, error) {
	h.releasing.Lock()
	defer h.releasing.Unlock()
	h.mu.Lock()
	k, already := h.keeper, h.released
	h.mu.Unlock()
	if already {
		return false, nil
	}
	if k != nil {
		// Stop first, so that no renewal races the release; its context
		// ends below, with what the release found.
		k.stop()
	}
	if h.parent != nil {
		h.markReleased()
		return false, h.confirm(ctx)
	}
	if err := h.Err(); err != nil {
		h.markReleased()
		return false, err
	}
	h.setDropping(true)
	ok, err := h.svc.releaseToken(ctx, h.Lock())
	var lost *domain.LockLostError
	switch {
	case errors.As(err, &lost) && h.retried() && lost.Reason == domain.LostRemoved:
		// No lock at all after an attempt of unknown outcome, which may
		// have removed it: released, not lost.
		err = nil
	case errors.As(err, &lost):
		h.setDropping(false)
		h.noteLost(lost)
	case err != nil:
		// Not known to be released: the handle keeps its place, but
		// nothing renews the lock any more.
		h.mu.Lock()
		h.dropping, h.attempted = false, true
		h.mu.Unlock()
		if k != nil {
			k.cancelHeld(fmt.Errorf("the keep-alive stopped for a release that failed, so the lock is renewed no more "+
				"and may stay stored until its expiry (Release again to remove it): %w", err))
		}
		return false, err
	}
	h.markReleased()
	return ok, err
}

// releaseToken removes held by its token if it is active now, and reports
// whether it did. A release that removes nothing returns the loss: as the
// store shows it, or, when it cannot be read, removed (or expired, past
// the lock's expiry).
func (s *LockService) releaseToken(ctx context.Context, held domain.Lock) (bool, error) {
	if err := s.gate.enter(); err != nil {
		return false, err
	}
	defer s.gate.leave()
	now := s.Now()
	ok, err := s.repo.DeleteToken(ctx, held.Resource, held.Token, now)
	if err != nil {
		return false, err
	}
	if ok {
		s.freed(held.Resource)
		e := Event{Kind: EventReleased, Owner: held.Owner, Resource: held.Resource, Previous: &held}
		if s.observer != nil {
			e.HeldFor = now.Sub(held.AcquiredAt)
		}
		s.observe(ctx, e)
		return true, nil
	}
	cur, err := s.repo.Get(ctx, held.Resource)
	lost, err := lossOnRead(held, cur, err, s.Now())
	return false, lossOfRelease(held, lost, err, now)
}

func (h *Handle) retried() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attempted
}

// errReleased answers a call (op) on a handle whose acquisition was
// released: not a loss, and not held either.
func (h *Handle) errReleased(op string) error {
	l := h.Lock()
	return fmt.Errorf("%s the lock of owner %q on %s (token %d): it was released through this handle (%w); Take it again to hold it",
		op, l.Owner, l.Resource, l.Token, domain.ErrExpired)
}

// confirm answers the release of a re-entry: nil only when the store shows
// the shared acquisition still held (unlike Lost, an unreadable store is no
// confirmation); otherwise its loss or the read's error.
func (h *Handle) confirm(ctx context.Context) error {
	if err := h.Err(); err != nil {
		return err
	}
	_, lost, err := h.svc.explainLoss(ctx, h.root().Lock())
	if lost != nil {
		return h.lossOrReleased(lost, "check")
	}
	return err
}

// lossOrReleased records lost, a loss that a read found, and returns it;
// or, once the acquisition is released, that it was released (op names
// the call). A read made while the release is written gets its loss
// unrecorded: the release records what it finds.
func (h *Handle) lossOrReleased(lost *domain.LockLostError, op string) error {
	if !h.noteLost(lost) && h.root().isReleased() {
		return h.errReleased(op)
	}
	return lost
}

// markReleased records that h is released: its followers end, and a root
// handle vacates its place in this service and wakes the resource's
// waiters.
func (h *Handle) markReleased() {
	h.mu.Lock()
	h.released, h.dropping = true, false
	followers, k := h.followers, h.keeper
	h.followers = nil
	h.mu.Unlock()
	for f := range followers {
		f.cancelHeld(errReleased)
	}
	if h.parent != nil {
		if k != nil {
			h.parent.unfollow(k)
		}
		return
	}
	h.svc.holders.vacate(h)
	h.svc.waiters.wake(h.Lock().Resource) // releaseToken yielded to other processes
}

// Do takes the lock on ref for owner (waiting if opts.Wait), keeps it
// alive while fn runs, and releases it when fn returns, fails or panics.
// fn's context ends the moment the lock is lost, with the
// *domain.LockLostError as its cause. After fn, Do asks the store, by
// token, whether the lock is still this acquisition's, and only then
// releases it; otherwise it returns the loss, even one the keep-alive had
// not noticed yet, joined with fn's error. A Take made with fn's context
// on the same resource is nested (see AcquireOptions.Reentrant).
//
// A service closed before the store confirmed the lock makes Do return an
// error matching domain.ErrClosed, joined with fn's: the lock may have
// been lost meanwhile.
//
// Errors: *domain.ValidationError for a nil fn or bad options, before
// anything is acquired; those of Take, before fn runs; afterwards fn's,
// joined with the loss, the release's error or domain.ErrClosed.
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
		// resource for the whole TTL.
		_, rerr := h.Release(context.WithoutCancel(ctx))
		var lost *domain.LockLostError
		switch {
		case rerr != nil && errors.Is(err, rerr):
			rerr = nil // fn returned the loss itself
		case errors.As(rerr, &lost): // LostClosed included
		case errors.Is(rerr, domain.ErrClosed):
			l := h.Lock()
			rerr = fmt.Errorf("the lock of owner %q on %s (token %d) could not be checked after the work: %w; "+
				"whether it was held until the work ended is not known, so treat the work as unprotected",
				l.Owner, l.Resource, l.Token, domain.ErrClosed)
		}
		err = errors.Join(err, rerr)
		if p != nil {
			panic(p)
		}
	}()
	return fn(held, h.Lock())
}
