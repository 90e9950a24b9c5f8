package application

import (
	"context"
	"sync"
	"time"

	"github.com/cleveragents/locks/domain"
)

// holders keeps, per resource, the handle of this service that holds its
// lock. The store's rule for a Take (DecideTake) already refuses any
// active lock; the slot lets a Take of this process be refused, or wait,
// without asking the store, names the holder as a handle of this process
// (InProcess), and lets its release wake the next waiter at once, with
// no polling. A handle holds its slot
// from its Take until it is released, lost (as it learns) or past its
// expiry as it last knew it; only then may another handle of this service
// take the resource, through the store as always.
type holders struct {
	mu    sync.Mutex
	slots map[domain.ResourceRef]*slot
}

type slot struct {
	// turn admits one Take at a time to decide on the resource: it checks
	// the holder and acquires, so that two Takes never both find it free.
	turn   chan struct{}
	holder *Handle
	users  int // Takes admitted or waiting for their turn
}

func newHolders() *holders { return &holders{slots: make(map[domain.ResourceRef]*slot)} }

// enter waits for ref's turn, or for ctx to end. leave must follow a nil
// error. A turn lasts one store call at most.
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

// holding returns the handle that holds sl now, if any: the caller has
// the turn.
func (hs *holders) holding(sl *slot, now time.Time) (domain.Lock, bool) {
	hs.mu.Lock()
	h := sl.holder
	hs.mu.Unlock()
	if h == nil {
		return domain.Lock{}, false
	}
	return h.holds(now)
}

// holdsToken reports whether sl's handle, unreleased, stands for the
// acquisition of token: the caller has the turn.
func (hs *holders) holdsToken(sl *slot, token int64) bool {
	hs.mu.Lock()
	h := sl.holder
	hs.mu.Unlock()
	return h != nil && !h.isReleased() && h.Lock().Token == token
}

// hold makes h the holder of sl: the caller has the turn.
func (hs *holders) hold(sl *slot, h *Handle) {
	hs.mu.Lock()
	sl.holder = h
	hs.mu.Unlock()
}

// vacate frees h's slot, if h still holds it.
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

// heldKey marks a context that KeepAlive returned: its value is the chain
// of handles whose work the context belongs to, innermost first.
type heldKey struct{}

type heldNode struct {
	h    *Handle
	next *heldNode
}

// withHeld returns ctx marked as the work of h, inside that of the
// handles ctx already names.
func withHeld(ctx context.Context, h *Handle) context.Context {
	next, _ := ctx.Value(heldKey{}).(*heldNode)
	return context.WithValue(ctx, heldKey{}, &heldNode{h: h, next: next})
}

// nestedIn returns the handle of this service on ref whose work ctx
// belongs to (a context from its KeepAlive or Do), or nil.
func (s *LockService) nestedIn(ctx context.Context, ref domain.ResourceRef) *Handle {
	for n, _ := ctx.Value(heldKey{}).(*heldNode); n != nil; n = n.next {
		if n.h.svc == s && n.h.Lock().Resource == ref && !n.h.isReleased() {
			return n.h
		}
	}
	return nil
}

// reenter answers a Take of ref made inside the work of outer, a handle
// on ref: a re-entry when asked for (opts.Reentrant) by outer's owner, at
// once and never behind the waiters for the lock it holds; otherwise a
// refusal, at once, since waiting would wait for itself.
//
// A re-entry checks by token that outer's lock is still held, and shares
// it: the new handle has outer's token, does not change the lock's expiry
// (outer's keep-alive keeps it, and a shorter TTL must not shorten it),
// and its Release leaves the lock to outer.
func (s *LockService) reenter(ctx context.Context, outer *Handle, owner string, ttl time.Duration, opts AcquireOptions) (*Handle, error) {
	root := outer
	for root.parent != nil {
		root = root.parent
	}
	l := root.Lock()
	if !opts.Reentrant || owner != l.Owner {
		return nil, &domain.LockConflictError{Holder: l, Now: s.Now(), InProcess: true, Nested: true}
	}
	if err := root.Err(); err != nil {
		return nil, err // known lost: the store may still show it, never share it
	}
	if err := s.gate.enter(); err != nil {
		return nil, err
	}
	defer s.gate.leave()
	if lost, err := s.lossNow(ctx, l); err != nil || lost != nil {
		if lost != nil {
			return nil, root.lossOrReleased(lost, "re-enter")
		}
		return nil, err
	}
	return &Handle{svc: s, ttl: ttl, lock: l, parent: root}, nil
}
