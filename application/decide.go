package application

import (
	"errors"
	"time"

	"github.com/cleveragents/locks/domain"
)

// The service's rules. Each is a pure function of the lock stored on a
// resource (nil when there is none) and of now: a store carries out what
// they decide (LockRepository.Update), and a store that decides in one
// statement (OneStatement) is held to them by the contract suite. A
// release has no choice to make: the store removes the caller's own lock
// (DeleteOwned) or a handle's by its token while active (DeleteToken);
// what a release that removed nothing means is lossOfRelease.

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

// OpKind names a decision that a OneStatement store may carry out.
type OpKind int

const (
	// OpAcquire is Acquire's rule, DecideAcquire.
	OpAcquire OpKind = iota + 1
	// OpTake is Take's rule, DecideTake: a handle's acquisition.
	OpTake
	// OpRenew is Renew's rule, DecideRenew.
	OpRenew
	// OpRenewToken is a handle's renewal, DecideRenewToken.
	OpRenewToken
)

// Op is one decision of the service on one resource.
type Op struct {
	// Kind is the rule that decides.
	Kind OpKind
	// Owner is the caller.
	Owner string
	// Ref is the resource.
	Ref domain.ResourceRef
	// Held is, for OpRenewToken, the handle's acquisition as it last knew
	// it (Owner and Ref are its own): only the row of its Token and Owner
	// may be extended.
	Held domain.Lock
	// At gives a store the time of the decision, now, and the new expiry,
	// now+TTL. The store calls it as close to its write as it can: inside
	// the transaction that writes, or just before a statement that decides
	// by itself.
	At func() (now, expires time.Time)
}

// Decide is op's rule in Go: the change it makes to cur, the lock stored
// on op.Ref (nil when there is none), at now with the new expiry expires.
func (op Op) Decide(cur *domain.Lock, now, expires time.Time) (Change, error) {
	switch op.Kind {
	case OpAcquire:
		return DecideAcquire(cur, op.Owner, op.Ref, now, expires)
	case OpTake:
		return DecideTake(cur, op.Owner, op.Ref, now, expires)
	case OpRenew:
		return DecideRenew(cur, op.Owner, op.Ref, now, expires)
	case OpRenewToken:
		return DecideRenewToken(cur, op.Held, now, expires)
	}
	return Change{}, errors.New("application: an Op of no known kind")
}

// DecideAcquire is Acquire's rule: the change that owner's Acquire of ref
// at now makes to cur, the lock stored on ref (nil when there is none),
// with expires = now+TTL; or a *domain.LockConflictError naming cur when
// another owner holds it at now. A re-entry (owner's own active lock)
// extends it to the later of its expiry and expires, never shortening
// it: whoever keeps the lock alive at its own TTL (a keep-alive, agents
// locks run) must not lose it to the same owner's re-entry with a
// shorter one.
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

// overDead is cur, the lock stored on a resource, as an acquire or a take
// decides on it once the liveness probe found holder's process gone:
// none, if cur is still holder's lock (the same token) and active (the
// store still replaces the row, which it read itself), and gone is true;
// otherwise cur as it is, changed since the probe.
func overDead(holder domain.Lock, cur *domain.Lock, now time.Time) (_ *domain.Lock, gone bool) {
	if cur != nil && cur.Token == holder.Token && !cur.ExpiredAt(now) {
		return nil, true
	}
	return cur, false
}

// lateWrite refuses l, written for owner on ref, if it has expired at
// now, when the store returned it: the store took longer than the TTL, and
// the lock is of no use to a caller who could not know it.
func lateWrite(l domain.Lock, owner string, ref domain.ResourceRef, now time.Time) error {
	if l.ExpiredAt(now) {
		return &domain.LockExpiredError{Owner: owner, Resource: ref, ExpiredAt: l.ExpiresAt, WrittenAt: now}
	}
	return nil
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

// lossOnRead is LossOf on what a read of held's resource returned at now
// (cur, or err: domain.ErrNotFound for no lock). A store that cannot be
// read is no proof of loss before held's expiry: nil and err then; after
// it, the loss.
func lossOnRead(held, cur domain.Lock, err error, now time.Time) (*domain.LockLostError, error) {
	switch {
	case err == nil:
		return LossOf(held, &cur, now), nil
	case errors.Is(err, domain.ErrNotFound):
		return LossOf(held, nil, now), nil
	case held.ExpiredAt(now):
		return &domain.LockLostError{Lock: held, Reason: domain.LostExpired, At: now}, nil
	}
	return nil, err
}

// lossOfRelease is the loss of held, whose release by token at now
// removed nothing (the lock was not this acquisition's, active, at now),
// given what a read of its resource said afterwards (lossOnRead).
func lossOfRelease(held domain.Lock, lost *domain.LockLostError, readErr error, now time.Time) *domain.LockLostError {
	switch {
	case lost != nil:
		return lost
	case readErr != nil:
		// Why is unknown, but not whether: the removal found no active
		// lock of this token, so it is lost. An active lock is taken over
		// only once removed (or its holder found gone).
		reason := domain.LostRemoved
		if held.ExpiredAt(now) {
			reason = domain.LostExpired
		}
		return &domain.LockLostError{Lock: held, Reason: reason, At: now}
	}
	// The store shows the lock active, after a removal that found it
	// expired: only a clock that went back could do that.
	return &domain.LockLostError{Lock: held, Reason: domain.LostExpired, At: now}
}

// lateRenewal is a handle's renewal of held that ended in err: a renewal
// written only after the lock had expired (lateWrite) is of no use, and
// the handle has lost the lock to a failing store.
func lateRenewal(held domain.Lock, err error) error {
	var (
		slow *domain.LockExpiredError
		lost *domain.LockLostError
	)
	if errors.As(err, &slow) && !errors.As(err, &lost) {
		return &domain.LockLostError{Lock: held, Reason: domain.LostStoreFailing, At: slow.WrittenAt, Err: slow}
	}
	return err
}
