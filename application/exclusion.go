package application

import (
	"context"
	"sync"
	"time"

	"github.com/cleveragents/locks/domain"
)

// holders keeps the handle of this service that holds each resource, so
// that a Take here is refused, or waits, without asking the store, and the
// holder's release wakes the next waiter.
type holders struct {
	mu    sync.Mutex
	slots map[domain.ResourceRef]*slot
}

type slot struct {
	// turn admits one Take at a time, so two never both find the resource free.
	turn   chan struct{}
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

// heldKey marks a KeepAlive context: its value chains the handles whose
// work it is, innermost first.
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

// reenter answers a Take of ref inside outer's work: with opts.Reentrant by
// outer's owner, a share of outer's lock, checked by token; otherwise a
// refusal at once, since waiting would wait for itself.
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
	if _, lost, err := s.explainLoss(ctx, l); lost != nil {
		return nil, root.lossOrReleased(lost, "re-enter")
	} else if err != nil {
		return nil, err
	}
	return &Handle{svc: s, ttl: ttl, lock: l, parent: root}, nil
}
