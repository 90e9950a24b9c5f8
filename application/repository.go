package application

import (
	"context"
	"time"

	"github.com/cleveragents/locks/domain"
)

// Clock is what the service needs of a clock to decide (clock.New() and
// clock.NewMock() of github.com/benbjohnson/clock satisfy it, and Timers).
type Clock interface {
	Now() time.Time // the current time; the service reads it once per call
}

// Timers is what waiting needs of a clock, so that a mock clock drives
// waits in tests; a Clock without it waits on real time.
type Timers interface {
	After(d time.Duration) <-chan time.Time // sends the time once d has passed
}

// ListFilter selects locks for List. Zero fields do not filter.
type ListFilter struct {
	Type     domain.ResourceType // only the locks of this resource type
	Owner    string              // only this owner's locks
	ActiveAt time.Time           // only the locks active at this instant
}

// LockRepository stores locks; locktest.Run checks every promise below. It
// is safe for concurrent use, reads during writes included, also by
// processes sharing a store. Owners and ids are exact byte strings (a
// database compares them with a binary collation). Every method returns a
// *domain.StoreError (matching domain.ErrUnavailable) when the store fails;
// Update also its Decide's error, unchanged. A write (Update, the Delete
// methods, OneStatement's Apply) whose ctx has ended returns ctx's error,
// not ErrUnavailable, and writes nothing.
type LockRepository interface {
	// Update reads the lock on ref and applies decide's change atomically, and
	// returns the lock stored afterwards (zero when there is none).
	Update(ctx context.Context, ref domain.ResourceRef, decide Decide) (domain.Lock, error)
	// Get returns the stored lock on ref, active or expired, or domain.ErrNotFound.
	Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error)
	// List returns the locks matching filter, ordered by resource type and id.
	List(ctx context.Context, filter ListFilter) ([]domain.Lock, error)
	// DeleteOwned removes owner's lock on ref, active or expired, and reports
	// whether it did (never true together with an error).
	DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error)
	// DeleteToken removes the lock on ref of token if active at now, and
	// reports whether it did: never another acquisition's, nor an expired one.
	DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error)
	// DeleteAllOwned removes every lock of owner and returns how many.
	DeleteAllOwned(ctx context.Context, owner string) (int, error)
	// DeleteExpired removes at most limit locks expired at now (ExpiresAt <=
	// now) and returns how many: fewer than limit only once none are left.
	DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error)
	// CountExpired returns how many stored locks have expired at now.
	CountExpired(ctx context.Context, now time.Time) (int, error)
}

// OneStatement is LockRepository's optional port: an Op in one statement,
// leaving what it does not decide to Update. Its now is read before the
// store, so it errs only where a later now agrees, and an extension checks
// the lock active at the write, lest a lapsed lock keep its token.
type OneStatement interface {
	// Apply carries out op atomically, deciding as op.Decide on the row.
	// Errors: for OpAcquire and OpTake, the rule's *domain.LockConflictError;
	// a *domain.StoreError. Any other outcome is undecided: ChangeNone, nil.
	Apply(ctx context.Context, op Op) (Outcome, error)
}

// Outcome is what a OneStatement store did.
type Outcome struct {
	Kind     ChangeKind   // the change written; ChangeNone: undecided, left to Update
	Lock     domain.Lock  // as stored afterwards
	Previous *domain.Lock // the expired lock replaced, on a takeover
}
