package application

import (
	"context"
	"time"

	"github.com/cleveragents/locks/domain"
)

// Clock is what the service needs of a clock to decide: the time. Both
// clock.New() and clock.NewMock() from github.com/benbjohnson/clock
// satisfy it, and also Timers.
type Clock interface {
	// Now returns the current time; the service reads it once per call.
	Now() time.Time
}

// Timers is what waiting needs of a clock. Waits for a lock, keep-alives
// and periodic cleanup all wait through it, so that a mock clock drives
// them in tests; a Clock that does not implement Timers waits on real time.
type Timers interface {
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// ListFilter selects locks for List. Zero fields do not filter.
type ListFilter struct {
	Type     domain.ResourceType // only the locks of this resource type
	Owner    string              // only this owner's locks
	ActiveAt time.Time           // only the locks active at this instant
}

// LockRepository stores locks: implement it to keep locks in a store of
// one's own, and check the implementation with locktest.Run, which holds
// it to every promise below. Implementations must be safe for concurrent
// use (reads run while others write), also by several processes sharing
// one store where the adapter supports it. Every method returns a
// *domain.StoreError (matching domain.ErrUnavailable) when the store
// fails; Update also returns its Decide function's error, unchanged.
//
// Owners and resource ids are exact byte strings (a database compares
// them with a binary collation, never one that folds case or pads).
//
// A write (Update, the Delete methods, OneStatement's Apply) whose ctx has
// ended before it is made returns the ctx's error (matching ctx.Err(), not
// domain.ErrUnavailable) and writes nothing: a caller that gave up has not
// released, acquired or purged anything.
type LockRepository interface {
	// Update reads the lock on ref and applies the change that decide
	// returns, atomically: no other writer can change the resource between
	// the read and the write. It returns the lock as stored afterwards (the
	// current one for ChangeNone, the zero Lock when there was none).
	Update(ctx context.Context, ref domain.ResourceRef, decide Decide) (domain.Lock, error)

	// Get returns the stored lock on ref, active or expired, or
	// domain.ErrNotFound.
	Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error)

	// List returns the locks matching filter, ordered by resource type and id.
	List(ctx context.Context, filter ListFilter) ([]domain.Lock, error)

	// DeleteOwned removes the lock on ref if owner holds it, active or
	// expired, and reports whether it removed one (never true with an error).
	DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error)

	// DeleteToken removes the lock on ref whose token is token if it is
	// active at now (now < ExpiresAt), and reports whether it did. It never
	// touches another acquisition's lock, nor the token's own once expired:
	// a Handle learns from a removal of nothing that it had lost its lock.
	DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error)

	// DeleteAllOwned removes every lock of owner and returns how many.
	DeleteAllOwned(ctx context.Context, owner string) (int, error)

	// DeleteExpired removes at most limit locks expired at now (ExpiresAt
	// <= now) and returns how many: fewer than limit only when no more have
	// expired. Callers loop, so that no single write holds the store long.
	DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error)

	// CountExpired returns how many stored locks have expired at now.
	CountExpired(ctx context.Context, now time.Time) (int, error)
}

// OneStatement is the one optional port of a LockRepository: a store that
// carries out a decision of the service (an Op) in one statement instead
// of a transaction that reads the row and then writes it. The service uses
// it, when its repository has it, for every Op, and decides through Update
// whatever it leaves undecided.
//
// Unlike Update, it is given now before it reaches the store (Op.At), so a
// store that waits for another writer decides at an earlier now: it may
// only err on the side that a later now would not contradict. A takeover
// or acquisition of a free resource stays right (an expired lock stays
// expired); a refusal is at worst early; but an extension (re-entry,
// renewal) must check that the lock is active at the write, or leave it
// undecided: extending a lapsed lock would keep its token across a moment
// when no one held it.
type OneStatement interface {
	// Apply carries out op atomically and reports what it did. Its
	// decisions must be op.Decide's on the row it changed. OpTake never
	// re-enters, and OpRenewToken extends only the row of op.Held's token
	// and owner.
	//
	// Errors: for OpAcquire and OpTake, the rule's
	// *domain.LockConflictError when a lock active at now refuses the
	// caller (nothing written); a *domain.StoreError when the store fails.
	// Any other outcome, every refusal of a renewal included, is left
	// undecided: Kind ChangeNone, a nil error, nothing written.
	Apply(ctx context.Context, op Op) (Outcome, error)
}

// Outcome is what a OneStatement store did.
type Outcome struct {
	// Kind is the change written: ChangeInsert when the resource changed
	// hands, ChangeExtend when the lock's expiry moved, ChangeNone when
	// nothing was written and the decision is left to Update.
	Kind ChangeKind
	// Lock is the lock as stored afterwards.
	Lock domain.Lock
	// Previous is the expired lock that was replaced, on a takeover.
	Previous *domain.Lock
}
