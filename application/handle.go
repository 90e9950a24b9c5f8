package application

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cleveragents/locks/domain"
)

// AcquireOptions tune Take and Do; zero: the default TTL, no waiting.
type AcquireOptions struct {
	TTL  time.Duration // the lock's time to live; zero means the service's default
	Wait bool          // waits, in arrival order among this service's callers, until ctx ends, Timeout or Close
	// Timeout bounds a wait on the service's clock (zero: ctx does); needs Wait.
	Timeout time.Duration
	// Reentrant lets a Take in the work (KeepAlive or Do context) of a handle holding the
	// resource share its token, never moving its expiry; else it is refused (Nested).
	Reentrant bool
	// Note is stored with a new lock and shown to operators and to other
	// owners refused by it (see domain.ValidateNote); a re-entry keeps the
	// note of the acquisition it re-enters.
	Note string
}

// Handle is one acquisition of a lock, renewed, kept alive, checked and released
// by its token, never another's (that is a loss). It is safe for concurrent use.
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
	followers map[*keeper]struct{}  // keep-alives ending with this acquisition
}

// Take acquires the lock on ref for owner, waiting if opts.Wait, and returns
// its handle: one acquisition, its own token, never re-entered (but see
// AcquireOptions.Reentrant), even by owner (SameOwner, or InProcess for
// another handle of this service).
// Errors: *domain.ValidationError; those of Acquire; after a wait, the last
// *domain.LockConflictError with Waited and Cause; domain.ErrClosed; a
// re-entry's *domain.LockLostError.
func (s *LockService) Take(ctx context.Context, owner string, ref domain.ResourceRef, opts AcquireOptions) (*Handle, error) {
	ttl, err := s.checkTake(owner, ref, opts)
	if err != nil {
		return nil, err
	}
	if outer := s.nestedIn(ctx, ref); outer != nil {
		return s.reenter(ctx, outer, owner, ttl, opts)
	}
	if !opts.Wait {
		return s.takeOnce(ctx, owner, ref, ttl, opts.Note, time.Time{})
	}
	start := s.started()
	h, err := s.waitTurn(ctx, ref, opts.Timeout, opts.Reentrant, func(notAfter time.Time) (*Handle, error) {
		return s.takeOnce(ctx, owner, ref, ttl, opts.Note, notAfter)
	})
	var l domain.Lock
	if h != nil {
		l = h.Lock()
	}
	s.observeWait(ctx, owner, ref, start, l, err)
	return h, err
}

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
	if err := domain.ValidateNote(opts.Note); err != nil {
		return 0, err
	}
	return ttl, nil
}

// takeOnce tries once in ref's turn, so that two Takes never both find it
// free: refused if a handle of this service holds ref, else by DecideTake.
func (s *LockService) takeOnce(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration, note string, notAfter time.Time) (*Handle, error) {
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
	r, err := s.acquire(ctx, owner, ref, ttl, note, decide, one)
	var conflict *domain.LockConflictError
	if errors.As(err, &conflict) && s.holders.holdsToken(sl, conflict.Holder.Token) {
		// This service's handle, renewed past its expiry as it knew it.
		conflict.InProcess = true
	}
	if err != nil {
		return nil, err
	}
	h := &Handle{svc: s, ttl: ttl, lock: r.Lock}
	s.holders.hold(sl, h)
	return h, nil
}

// holders keeps each resource's holding handle of this service.
type holders struct {
	mu    sync.Mutex
	slots map[domain.ResourceRef]*slot
}

type slot struct {
	turn   chan struct{} // one Take at a time, so two never both find the resource free
	holder *Handle
	users  int // Takes admitted or waiting for their turn
}

// enter waits for ref's turn (one store call at most), or for ctx.
func (hs *holders) enter(ctx context.Context, ref domain.ResourceRef) (*slot, error) {
	hs.mu.Lock()
	sl := hs.slots[ref]
	if sl == nil {
		sl = &slot{turn: make(chan struct{}, 1)}
		hs.slots[ref] = sl
	}
	sl.users++
	hs.mu.Unlock()
	select {
	case sl.turn <- struct{}{}:
		return sl, nil
	case <-ctx.Done():
		hs.drop(ref, sl)
		return nil, ctx.Err()
	}
}

func (hs *holders) leave(ref domain.ResourceRef, sl *slot) {
	<-sl.turn
	hs.drop(ref, sl)
}

func (hs *holders) drop(ref domain.ResourceRef, sl *slot) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	sl.users--
	if sl.users == 0 && sl.holder == nil {
		delete(hs.slots, ref)
	}
}

// The caller of holder, holding, holdsToken and hold has sl's turn.
func (hs *holders) holder(sl *slot) *Handle {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return sl.holder
}

// holding returns the lock of the handle that holds sl at now, if any.
func (hs *holders) holding(sl *slot, now time.Time) (domain.Lock, bool) {
	if h := hs.holder(sl); h != nil {
		return h.holds(now)
	}
	return domain.Lock{}, false
}

// holdsToken reports whether sl's handle, unreleased, stands for token.
func (hs *holders) holdsToken(sl *slot, token int64) bool {
	h := hs.holder(sl)
	return h != nil && !h.isReleased() && h.Lock().Token == token
}

func (hs *holders) hold(sl *slot, h *Handle) {
	hs.mu.Lock()
	sl.holder = h
	hs.mu.Unlock()
}

func (hs *holders) vacate(h *Handle) {
	ref := h.Lock().Resource
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if sl := hs.slots[ref]; sl != nil && sl.holder == h {
		sl.holder = nil
		if sl.users == 0 {
			delete(hs.slots, ref)
		}
	}
}

// heldKey's value chains the handles whose work a KeepAlive context is.
type heldKey struct{}

type heldNode struct {
	h    *Handle
	next *heldNode
}

func withHeld(ctx context.Context, h *Handle) context.Context {
	next, _ := ctx.Value(heldKey{}).(*heldNode)
	return context.WithValue(ctx, heldKey{}, &heldNode{h: h, next: next})
}

// nestedIn returns the handle of this service on ref whose work ctx is, or nil.
func (s *LockService) nestedIn(ctx context.Context, ref domain.ResourceRef) *Handle {
	for n, _ := ctx.Value(heldKey{}).(*heldNode); n != nil; n = n.next {
		if n.h.svc == s && n.h.Lock().Resource == ref && !n.h.isReleased() {
			return n.h
		}
	}
	return nil
}

// reenter answers a Take of ref in outer's work: a share of outer's lock,
// checked by token, with opts.Reentrant by its owner; else a refusal at once.
func (s *LockService) reenter(ctx context.Context, outer *Handle, owner string, ttl time.Duration, opts AcquireOptions) (*Handle, error) {
	root := outer.root() // a re-entry's parent is always a root
	l := root.Lock()
	if !opts.Reentrant || owner != l.Owner {
		return nil, &domain.LockConflictError{Holder: l, Now: s.Now(), InProcess: true, Nested: true}
	}
	if err := root.Err(); err != nil {
		return nil, err // known lost: the store may still show it, never share it
	}
	if _, lost, err := s.explainLoss(ctx, l); lost != nil {
		return nil, root.lossOrReleased(lost, "re-enter")
	} else if err != nil {
		return nil, err
	}
	return &Handle{svc: s, ttl: ttl, lock: l, parent: root}, nil
}

// Lock returns the lock as last acquired or renewed; its token never changes.
func (h *Handle) Lock() domain.Lock {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lock
}

// TTL returns the TTL the handle acquires and renews with.
func (h *Handle) TTL() time.Duration { return h.ttl }

// holds returns the lock if held at now as far as h knows (a release may fail).
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

// noteLost records a loss once, on the root, ends its followers and wakes
// waiters; not once released or while the release writes (it knows better).
func (h *Handle) noteLost(lost *domain.LockLostError) (recorded bool) {
	r := h.root()
	r.mu.Lock()
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

// follow makes k's context end with h's acquisition, lost or released.
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

// Renew extends this acquisition's lock to now+TTL by token and returns it;
// a re-entered handle only checks that the shared lock is held. A loss it
// finds ends the keep-alive contexts.
// Errors: *domain.LockLostError with the reason the store shows, or
// LostStoreFailing when the write outlasted the TTL; one matching
// domain.ErrExpired after a release; *domain.StoreError; domain.ErrClosed.
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

// renewToken renews held by its token, never through an owner-scoped write.
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

// explainLoss reads held's resource: the lock, and held's loss (lossOnRead).
func (s *LockService) explainLoss(ctx context.Context, held domain.Lock) (domain.Lock, *domain.LockLostError, error) {
	if err := s.gate.enter(); err != nil {
		return domain.Lock{}, nil, err
	}
	defer s.gate.leave()
	cur, err := s.repo.Get(ctx, held.Resource)
	lost, err := lossOnRead(held, cur, err, s.Now())
	return cur, lost, err
}

// Release stops the keep-alive and removes this acquisition's lock by token
// if still active, reporting whether it did (never for a re-entry or a second
// call). A failed release keeps the handle's place: call it again.
// Errors: the *domain.LockLostError of a lost lock; *domain.StoreError or
// ctx's error when it may not have happened; domain.ErrClosed.
func (h *Handle) Release(ctx context.Context) (bool, error) {
	h.releasing.Lock()
	defer h.releasing.Unlock()
	h.mu.Lock()
	k, already, retried := h.keeper, h.released, h.attempted
	h.mu.Unlock()
	if already {
		return false, nil
	}
	if k != nil {
		// Stop first, so that no renewal races the release.
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
	case errors.As(err, &lost) && retried && lost.Reason == domain.LostRemoved:
		// No lock after an attempt that may have removed it: released.
		err = nil
	case errors.As(err, &lost):
		h.setDropping(false)
		h.noteLost(lost)
	case err != nil:
		// Maybe not released: the handle keeps its place, unrenewed.
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

// releaseToken removes held by token if active; else it returns the loss.
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

// errReleased answers op on a released handle: not a loss, not held either.
func (h *Handle) errReleased(op string) error {
	l := h.Lock()
	return fmt.Errorf("%s the lock of owner %q on %s (token %d): it was released through this handle (%w); Take it again to hold it",
		op, l.Owner, l.Resource, l.Token, domain.ErrExpired)
}

// confirm is nil only if the store shows a re-entry's shared lock held.
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

// lossOrReleased records lost and returns it, or that h was released.
func (h *Handle) lossOrReleased(lost *domain.LockLostError, op string) error {
	if !h.noteLost(lost) && h.root().isReleased() {
		return h.errReleased(op)
	}
	return lost
}

// markReleased ends the followers; a root vacates its place and wakes waiters.
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

// Do takes the lock (waiting if opts.Wait), runs fn with it kept alive and
// fn's context ending when it is lost, then checks it by token and releases it.
// Errors: *domain.ValidationError for a nil fn or bad options; those of
// Take; then fn's, joined with the loss, the release's or ErrClosed.
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
		// Even when ctx has ended: a lock left behind blocks for its TTL.
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
