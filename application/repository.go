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
	Now() time.Time
}

// Timers is what waiting needs of a clock: a channel that receives once d
// has passed on that clock. Waiting for a lock, keeping one alive and
// periodic cleanup all wait through it, so that a mock clock drives them
// in tests without sleeping. A Clock that does not implement Timers waits
// on real time.
type Timers interface {
	After(d time.Duration) <-chan time.Time
}

// realTimers waits on real time, for a Clock that has no timers.
type realTimers struct{}

func (realTimers) After(d time.Duration) <-chan time.Time { return time.After(d) }

// timersOf returns clk's timers, or real ones.
func timersOf(clk Clock) Timers {
	if t, ok := clk.(Timers); ok {
		return t
	}
	return realTimers{}
}

// ChangeKind says what a Decide function wants done with a resource's row.
type ChangeKind int

const (
	// ChangeNone leaves the store untouched.
	ChangeNone ChangeKind = iota
	// ChangeInsert removes any existing lock on the resource and stores
	// Change.Lock as a new lock with a new, larger fencing token. It is used
	// whenever the resource changes hands.
	ChangeInsert
	// ChangeExtend sets the expiry of the current lock to
	// Change.Lock.ExpiresAt, keeping its owner, acquisition time and token.
	ChangeExtend
)

// Change is the outcome of a Decide function.
type Change struct {
	Kind ChangeKind
	// Lock carries the new owner, resource and times for ChangeInsert (its
	// Token is ignored and assigned by the store), and the new ExpiresAt for
	// ChangeExtend.
	Lock domain.Lock
}

// Decide looks at the current lock on a resource (nil when there is none)
// and returns the change to apply, or an error to abort with nothing written.
type Decide func(current *domain.Lock) (Change, error)

// ListFilter selects locks for List. Zero fields do not filter.
type ListFilter struct {
	Type  domain.ResourceType
	Owner string
	// ActiveAt, when set, keeps only the locks that are active at that
	// instant; zero includes expired locks too.
	ActiveAt time.Time
}

// LockRepository stores locks. Implementations must be safe for concurrent
// use, also by several processes sharing one store where the adapter
// supports it. Every method returns a *domain.StoreError (matching
// domain.ErrUnavailable) when the store fails; Update also returns whatever
// error its Decide function returns, unchanged.
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
	// expired, and reports whether it removed one.
	DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error)

	// DeleteAllOwned removes every lock of owner and returns how many.
	DeleteAllOwned(ctx context.Context, owner string) (int, error)

	// DeleteExpired removes at most limit locks that have expired at now
	// (ExpiresAt <= now) and returns how many. Callers loop to purge more, so
	// that no single write holds the store for long.
	DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error)

	// CountExpired returns how many stored locks have expired at now.
	CountExpired(ctx context.Context, now time.Time) (int, error)
}
