package application

import (
	"context"
	"errors"
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

// Timers is what waiting needs of a clock: a channel that receives once d
// has passed on that clock. Waiting for a lock, keeping one alive and
// periodic cleanup all wait through it, so that a mock clock drives them
// in tests without sleeping. A Clock that does not implement Timers waits
// on real time.
type Timers interface {
	// After returns a channel that receives once d has passed.
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
	// Change.Lock as a new lock with a new fencing token, larger than every
	// token the store has handed out before, on any resource. Tokens need
	// not start at 1 nor be consecutive; they must never repeat, and they
	// grow in the order of the writes. It is used whenever the resource
	// changes hands.
	ChangeInsert
	// ChangeExtend sets the expiry of the current lock to
	// Change.Lock.ExpiresAt, keeping its owner, acquisition time and token.
	// The expiry given is the new one, earlier or later than the current
	// one: a renewal with a shorter TTL shortens the lock (a re-entry's
	// rule, DecideAcquire, never gives an earlier one).
	ChangeExtend
)

// Change is the outcome of a Decide function.
type Change struct {
	// Kind is what to do with the resource's row.
	Kind ChangeKind
	// Lock carries the new owner, resource and times for ChangeInsert (its
	// Token is ignored and assigned by the store), and the new ExpiresAt for
	// ChangeExtend.
	Lock domain.Lock
}

// Decide looks at the current lock on a resource (nil when there is none)
// and returns the change to apply, or an error to abort with nothing written.
// A store may call it more than once for one Update (a transaction that was
// rolled back runs again); only its last call's decision stands.
type Decide func(current *domain.Lock) (Change, error)

// ListFilter selects locks for List. Zero fields do not filter.
type ListFilter struct {
	// Type, when set, keeps only the locks of that resource type.
	Type domain.ResourceType
	// Owner, when set, keeps only that owner's locks.
	Owner string
	// ActiveAt, when set, keeps only the locks that are active at that
	// instant; zero includes expired locks too.
	ActiveAt time.Time
}

// LockRepository stores locks: implement it to keep locks in a store of
// one's own, and check the implementation with locktest.Run, which holds
// it to every promise below. Implementations must be safe for concurrent
// use, reads included (Get, List and CountExpired run while others
// write), also by several processes sharing one store where the adapter
// supports it. Every method returns a *domain.StoreError (matching
// domain.ErrUnavailable) when the store fails; Update also returns whatever
// error its Decide function returns, unchanged.
//
// Owners and resource ids are exact byte strings: two that differ in any
// byte (case, trailing spaces, another Unicode normalisation) are
// different owners and different resources, for every method. A store
// over a database compares them with a binary collation, never one that
// folds case or pads with spaces.
//
// A write (Update, the Delete methods, and the optional ports below)
// whose ctx has ended before it is made returns the ctx's error (matching
// ctx.Err() with errors.Is, and not domain.ErrUnavailable) and writes
// nothing: a caller that has given up, or timed out, has not released,
// acquired or purged anything.
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
	// expired, and reports whether it removed one (never true together
	// with an error).
	DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error)

	// DeleteToken removes the lock on ref whose token is token, if it is
	// active at now (now < ExpiresAt), and reports whether it removed it.
	// It never touches another acquisition's lock, whatever its owner,
	// nor the token's own lock once it has expired: a Handle releases the
	// one acquisition it stands for, and learns from a removal of nothing
	// that it had lost it.
	DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error)

	// DeleteAllOwned removes every lock of owner and returns how many.
	DeleteAllOwned(ctx context.Context, owner string) (int, error)

	// DeleteExpired removes at most limit locks that have expired at now
	// (ExpiresAt <= now) and returns how many: limit, or fewer only when
	// no more have expired. Callers loop to purge more, so that no single
	// write holds the store for long, and stop at a batch smaller than
	// limit.
	DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error)

	// CountExpired returns how many stored locks have expired at now.
	CountExpired(ctx context.Context, now time.Time) (int, error)
}

// ErrUndecided is what an Acquirer returns when it leaves a call to
// Update: the service then takes the decision there, with the Go rule. It
// never reaches the service's callers.
var ErrUndecided = errors.New("the store left this decision to Update")

// Acquirer is an optional capability of a LockRepository: carrying out
// Acquire's rule (DecideAcquire) itself, in one write, instead of a
// transaction that reads the row and then writes it. The service uses it
// when its repository has it (a type assertion), for Acquire only.
//
// Unlike Update, it is given now before it reaches the store: the service
// cannot read the clock in the middle of one statement. A store that waits
// (for another writer of the resource) decides at that earlier now, so it
// must only ever err on the side that a later now would not contradict:
// an expired lock stays expired later, so a takeover or an acquisition of
// a free resource at the earlier now is also right at the write; a lock
// active at the earlier now may have expired meanwhile, so a refusal is
// at worst early, and a re-entry must be checked against the time of the
// write, or left to Update (ErrUndecided).
type Acquirer interface {
	// AcquireAt applies Acquire's rule for owner on ref at the now that at
	// gives, with the new expiry it gives (now+TTL), atomically, and
	// reports what it did.
	// Its decisions must be DecideAcquire's on the row it changed.
	//
	// Errors: a *domain.LockConflictError naming the holder when another
	// owner's lock, stored and active at now, refuses the caller (nothing
	// written); ErrUndecided when the store did not decide (nothing
	// written): the caller decides through Update; a *domain.StoreError
	// when the store fails.
	AcquireAt(ctx context.Context, ref domain.ResourceRef, owner string, at Timing) (Acquisition, error)
}

// Renewer is an optional capability of a LockRepository: carrying out
// Renew's extension in one write, instead of a transaction that reads the
// row and then writes it. The service uses it when its repository has it,
// for Renew only, and leaves every other outcome to Update.
//
// As for an Acquirer, now is read before the write, which may wait: the
// lock must be owner's and active at the time of the write, not only at
// now, or extending it would keep its token across a moment when it had
// lapsed (Renew of an expired lock must fail).
type Renewer interface {
	// RenewAt sets the expiry of owner's lock on ref to the expiry that at
	// gives (now+TTL), if that lock is active at the time of the write, and
	// returns the lock as stored afterwards. Its decision must be
	// DecideRenew's extension on the row it changed.
	//
	// Errors: ErrUndecided when it extended nothing (nothing written): the
	// caller decides through Update, which also names the error; a
	// *domain.StoreError when the store fails.
	RenewAt(ctx context.Context, ref domain.ResourceRef, owner string, at Timing) (domain.Lock, error)
}

// TokenRenewer is an optional capability of a LockRepository: a Handle's
// renewal in one write. A handle renews its own acquisition, by token,
// never whatever lock its owner holds: the write must match the token as
// well as the owner, and the lock must be active at the time of the
// write, as for a Renewer. A store without it renews handles through
// Update (DecideRenewToken), never through an owner-scoped write.
type TokenRenewer interface {
	// RenewTokenAt sets the expiry of the lock on ref whose token is token
	// and whose owner is owner to the expiry that at gives, if that lock
	// is active at the time of the write, and returns the lock as stored
	// afterwards. Its decision must be DecideRenewToken's extension.
	//
	// Errors: ErrUndecided when it extended nothing (nothing written):
	// the caller decides through Update, which also explains the loss; a
	// *domain.StoreError when the store fails.
	RenewTokenAt(ctx context.Context, ref domain.ResourceRef, owner string, token int64, at Timing) (domain.Lock, error)
}

// DecideRenewToken is a Handle's renewal rule: the extension of held, the
// handle's acquisition, to expires (now+TTL) if cur, the lock stored on
// its resource, is that acquisition (same token and owner) and active at
// now; otherwise the *domain.LockLostError that says why it is lost
// (LossOf). Unlike DecideRenew, it never extends a lock of the same owner
// with another token: that is another acquisition.
func DecideRenewToken(cur *domain.Lock, held domain.Lock, now, expires time.Time) (Change, error) {
	if lost := LossOf(held, cur, now); lost != nil {
		return Change{}, lost
	}
	return Change{Kind: ChangeExtend, Lock: domain.Lock{ExpiresAt: expires}}, nil
}

// LossOf says whether, and why, held is lost at now, given cur, the lock
// stored on its resource (nil when there is none): nil while cur is held
// itself (same token and owner), active; otherwise a *domain.LockLostError
// with At set to now and the reason that the store shows:
//   - another token (another acquisition, of any owner): taken over, with
//     cur as NewHolder, whether or not cur is still active;
//   - held's own row, expired: expired;
//   - no row, before held's expiry as last known: removed (released
//     elsewhere, or purged by a clock running ahead); after it: expired
//     (and perhaps purged since).
func LossOf(held domain.Lock, cur *domain.Lock, now time.Time) *domain.LockLostError {
	lost := &domain.LockLostError{Lock: held, At: now}
	switch {
	case cur == nil && held.ExpiredAt(now):
		lost.Reason = domain.LostExpired
	case cur == nil:
		lost.Reason = domain.LostRemoved
	case cur.Token != held.Token || cur.Owner != held.Owner:
		holder := *cur
		lost.Reason, lost.NewHolder = domain.LostTakenOver, &holder
	case cur.ExpiredAt(now):
		lost.Reason, lost.Lock = domain.LostExpired, *cur
	default:
		return nil
	}
	return lost
}

// Timing gives an Acquirer or a Renewer the time of its decision, now, and the new
// expiry, now+TTL. The store calls it once, as close to its write as it
// can: inside the transaction that writes, or just before a statement
// that decides by itself.
type Timing func() (now, expires time.Time)

// Acquisition is what an Acquirer did.
type Acquisition struct {
	// Lock is the lock as stored afterwards.
	Lock domain.Lock
	// Reentered says that Lock was owner's active lock, extended.
	Reentered bool
	// Previous is the expired lock that was replaced, on a takeover.
	Previous *domain.Lock
}

// DecideRenew is Renew's rule: the extension of owner's lock cur on ref to
// expires (now+TTL) if it is active at now; a *domain.LockExpiredError when
// owner holds nothing there at now (no lock, its own lock has expired, or
// another owner's has); a *domain.LockConflictError naming cur when
// another owner holds it at now.
func DecideRenew(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	switch {
	case cur == nil:
		return Change{}, &domain.LockExpiredError{Owner: owner, Resource: ref}
	case cur.Owner == owner && cur.ExpiredAt(now):
		return Change{}, &domain.LockExpiredError{Owner: owner, Resource: ref, ExpiredAt: cur.ExpiresAt}
	case cur.Owner == owner:
		return Change{Kind: ChangeExtend, Lock: domain.Lock{ExpiresAt: expires}}, nil
	case cur.ExpiredAt(now):
		// Someone else's lapsed lock: the caller holds nothing here.
		return Change{}, &domain.LockExpiredError{Owner: owner, Resource: ref}
	default:
		return Change{}, &domain.LockConflictError{Holder: *cur, Now: now}
	}
}

// DecideAcquire is Acquire's rule: the change that owner's Acquire of ref
// at now makes to cur, the lock stored on ref (nil when there is none),
// with expires = now+TTL; or a *domain.LockConflictError naming cur when
// another owner holds it at now. A re-entry (owner's own active lock)
// extends it to the later of its expiry and expires, never shortening
// it: whoever keeps the lock alive at its own TTL (a keep-alive, agents
// locks run) must not lose it to the same owner's re-entry with a
// shorter one. An Acquirer repeats it in its own terms,
// and the contract suite checks the two against each other.
func DecideAcquire(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	switch {
	case cur == nil || cur.ExpiredAt(now):
		// Free, or the previous lock has lapsed: the resource changes
		// hands (even back to the same owner, who held nothing between
		// the expiry and now), so it gets a new token.
		return Change{Kind: ChangeInsert, Lock: domain.Lock{
			Owner: owner, Resource: ref, AcquiredAt: now, ExpiresAt: expires,
		}}, nil
	case cur.Owner == owner:
		return Change{Kind: ChangeExtend, Lock: domain.Lock{ExpiresAt: later(cur.ExpiresAt, expires)}}, nil
	default:
		return Change{}, &domain.LockConflictError{Holder: *cur, Now: now}
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// DecideTake is Take's rule, for a handle: the change that owner's Take of
// ref at now makes to cur, the lock stored on ref (nil when there is
// none), with expires = now+TTL. A free or expired resource gets a new
// lock with a new token; an active lock refuses the Take with a
// *domain.LockConflictError naming it, whatever its owner: unlike
// DecideAcquire, it never re-enters, since a handle is one acquisition
// and must never share another's token (for the same owner, SameOwner is
// set). The only way for handles to share a token is an explicit re-entry
// inside the holder's work (AcquireOptions.Reentrant), which does not
// reach the store's rule.
func DecideTake(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	if cur == nil || cur.ExpiredAt(now) {
		return Change{Kind: ChangeInsert, Lock: domain.Lock{
			Owner: owner, Resource: ref, AcquiredAt: now, ExpiresAt: expires,
		}}, nil
	}
	return Change{}, &domain.LockConflictError{Holder: *cur, Now: now, SameOwner: cur.Owner == owner}
}

// Taker is an optional capability of a LockRepository: carrying out Take's
// rule (DecideTake) itself, in one write, as an Acquirer does Acquire's.
// The service uses it for Take only, and never an Acquirer there: an
// Acquirer re-enters the owner's active lock, which a Take must refuse.
// The same caution about now holds as for an Acquirer; there is no
// re-entry to check at the time of the write.
type Taker interface {
	// TakeAt applies Take's rule for owner on ref at the now that at
	// gives, with the new expiry it gives, atomically, and reports what it
	// did (never Reentered). Its decisions must be DecideTake's on the row
	// it changed.
	//
	// Errors: DecideTake's *domain.LockConflictError when an active lock,
	// of any owner, is stored at now (nothing written); ErrUndecided when
	// the store did not decide (nothing written): the caller decides
	// through Update; a *domain.StoreError when the store fails.
	TakeAt(ctx context.Context, ref domain.ResourceRef, owner string, at Timing) (Acquisition, error)
}
