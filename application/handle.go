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
	// holder. The re-entered handle never moves the lock's expiry: its
	// Renew checks the holder's acquisition by token, its KeepAlive
	// renews nothing and ends with the holder's, so that a shorter TTL
	// never shortens the holder's lock. Without it, such a Take is
	// refused at once with a *domain.LockConflictError whose Nested is
	// set: waiting would wait for itself. It has no effect on a Take from anywhere else: another
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

	// releasing admits one Release at a time: a failed one may be retried.
	releasing sync.Mutex

	mu        sync.Mutex
	lock      domain.Lock
	released  bool
	dropping  bool                  // its release is removing the lock
	attempted bool                  // a release failed, and may have removed it
	lost      *domain.LockLostError // the loss, once the handle learns of it
	keeper    *keeper               // nil until KeepAlive
	// followers are the keep-alives whose contexts end with this
	// acquisition (lost or released): its own and its re-entries'.
	followers map[*keeper]struct{}
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
// Nor does a Take ever share a lock it finds in the store: an active lock
// of any owner, the caller's own included, refuses it (DecideTake), with
// SameOwner set when the holder has the caller's owner id (an
// owner-scoped Acquire of that owner, another process given the same
// owner id, a handle whose release did not complete). With opts.Wait it
// waits for that lock as for any other. Only a re-entry shares a token.
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
// service holds ref, otherwise the store decides by Take's rule
// (DecideTake), which never re-enters a lock it finds active, whoever
// holds it: a handle that gave up its place here while the store still
// has its lock (a release that failed, a loss declared while its renewal
// committed) is refused there, never shared. The check and the
// acquisition run in ref's turn, so that two Takes never both find ref
// free of handles.
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
	decide, one := DecideTake, &Op{Kind: OpTake}
	if !notAfter.IsZero() {
		decide, one = s.beforeDeadline(decide, notAfter), nil
	}
	r, err := s.acquire(ctx, owner, ref, ttl, decide, one)
	l := r.Lock
	var conflict *domain.LockConflictError
	if errors.As(err, &conflict) && s.holders.holdsToken(sl, conflict.Holder.Token) {
		// The store's holder is this service's handle, past its expiry as
		// it knew it, renewed behind its back: say so, and let a waiter
		// wait for its release rather than poll.
		conflict.InProcess = true
	}
	if err != nil {
		return nil, err
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
// holds it until the store has removed it and its slot is vacated, and so
// does one whose release failed: it may still hold the lock in the store.
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

// root returns the handle whose acquisition h stands for: h itself, or
// the handle a re-entry shares it with.
func (h *Handle) root() *Handle {
	if h.parent != nil {
		return h.parent
	}
	return h
}

// noteLost is the one place where a handle learns of its loss, whoever
// found it (its keep-alive, a renewal, a release, Lost, a re-entry): it
// records the loss, once, on the acquisition (the root handle), ends the
// context of every keep-alive that follows it (its own and those of its
// re-entries) with the loss as their cause, and lets the service's
// waiters for the resource try at once. It does nothing once the
// acquisition is released, or while its release is being written, and
// then reports false.
func (h *Handle) noteLost(lost *domain.LockLostError) (recorded bool) {
	r := h.root()
	r.mu.Lock()
	// A released acquisition was given up, not lost: what a read finds
	// (nothing, or another holder) is no loss of the handle's. While its
	// release is being written, only the release's outcome says whether
	// a read saw its removal or a loss before it: the release records it.
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

// setDropping marks the acquisition's release as being written (or no
// longer): a loss read meanwhile is the release's own removal.
func (h *Handle) setDropping(on bool) {
	h.mu.Lock()
	h.dropping = on
	h.mu.Unlock()
}

// follow makes k's context end with h's acquisition: lost (with the loss)
// or released. It ends it at once if that has already happened.
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

// unfollow forgets k, a keep-alive that has ended.
func (h *Handle) unfollow(k *keeper) {
	h.mu.Lock()
	delete(h.followers, k)
	h.mu.Unlock()
}

// Renew extends this acquisition's lock to now+TTL and returns it. It
// renews by token: the same owner's lock with another token is another
// acquisition, never extended or adopted. A re-entered handle
// (AcquireOptions.Reentrant) never moves the lock's expiry: the handle it
// re-entered keeps it, and a shorter TTL must not shorten it; its Renew
// checks, by token, that the shared lock is still held, and returns it as
// stored. A loss it finds ends the handle's keep-alive context (and that
// of the handle it shares the lock with) as the keep-alive's own would.
//
// Errors: *domain.LockLostError when the lock is no longer this
// handle's (another token holds the resource, its lock has expired or was
// removed), with the reason the store shows, or when the store took longer
// than the TTL to write the renewal (LostStoreFailing); an error matching
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
		l, err = h.svc.checkToken(ctx, h.parent.Lock())
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

// Release stops the keep-alive, if any, waits for it to end, and releases
// this acquisition's lock (by token) if it is still active; it reports
// whether it removed it. Another acquisition's lock, of any owner, is
// never touched. A re-entered handle (AcquireOptions.Reentrant) leaves
// the lock to the handle it re-entered, and removes nothing. Releasing
// twice is harmless: the second call reports false and nil.
//
// A release that the store failed, or that its context cancelled, leaves
// the handle as it was, but for its keep-alive, which has stopped: it
// still holds its place in this service (no other handle here takes the
// resource until its expiry) and the lock may still be stored. Call
// Release again: a retry that succeeds removes the lock, and one that
// finds no lock at all reports false and nil (the failed attempt may have
// removed it).
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
		// The keep-alive stops first, so that no renewal races the
		// release; its context ends below, with what the release found.
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
		// No lock at all, after an attempt whose outcome was not known:
		// that attempt may have removed it. Released, not lost.
		err = nil
	case errors.As(err, &lost):
		h.setDropping(false)
		h.noteLost(lost) // ends the keep-alive's context with the loss
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

// retried reports whether an earlier release of h failed after it may
// have removed the lock.
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

// confirm answers the release of a re-entry: nil only when the store
// shows the shared acquisition still held; otherwise its loss, or the
// error that kept the store from saying (ErrClosed included). Unlike
// Lost, a store that cannot be read is no confirmation.
func (h *Handle) confirm(ctx context.Context) error {
	if err := h.Err(); err != nil {
		return err
	}
	lost, err := h.svc.explainLoss(ctx, h.root().Lock())
	if lost != nil {
		return h.lossOrReleased(lost, "check")
	}
	return err
}

// lossOrReleased records lost, a loss that a read found, and returns
// what to tell the caller: the loss; or, once the acquisition is
// released, that it was released (op names the call). A read made while
// the release is being written gets the loss it saw, unrecorded: the
// lock is not held either way, and the release records what it finds.
func (h *Handle) lossOrReleased(lost *domain.LockLostError, op string) error {
	if !h.noteLost(lost) && h.root().isReleased() {
		return h.errReleased(op)
	}
	return lost
}

// markReleased records that h is released: the keep-alives that follow
// it end, and a root handle gives up its place in this service and lets
// the waiters for its resource try.
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
// fn's context ends the moment the lock is lost; context.Cause(ctx) is
// then the *domain.LockLostError. After fn returns, Do stops the
// keep-alive and asks the store, by token, whether the lock is still this
// acquisition's: only then does it release it. Otherwise it returns the
// loss, joined with fn's error, and releases nothing: a loss that the
// keep-alive had not noticed yet (a pause, a removal, a takeover while fn
// ran) is returned too. A Take made with fn's context on the same
// resource is nested (see AcquireOptions.Reentrant).
//
// Do reports success only once the store has confirmed the lock: a
// service closed before that (the container shutting down while fn ran,
// its keep-alive stopped by ctx) makes Do return an error matching
// domain.ErrClosed, joined with fn's, since the lock may have been lost
// meanwhile. The container releases the owner's locks as it closes.
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
		// resource for the whole TTL. The store's own retries and timeouts
		// bound this call.
		_, rerr := h.Release(context.WithoutCancel(ctx))
		var lost *domain.LockLostError
		switch {
		case rerr != nil && errors.Is(err, rerr):
			rerr = nil // fn returned the loss itself
		case errors.As(rerr, &lost):
			// The loss, LostClosed included: reported as it is.
		case errors.Is(rerr, domain.ErrClosed):
			// The service closed before Do could ask the store: the lock
			// may have been lost while fn ran, so this is no success.
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
