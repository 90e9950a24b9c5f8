package application

import (
	"errors"
	"time"

	"github.com/cleveragents/locks/domain"
)

// The service's rules, each a pure function of the lock stored on a
// resource (nil when there is none) and of now. A store carries them out
// (LockRepository.Update), or is held to them by the contract suite
// (OneStatement).

// ChangeKind says what a Decide function wants done with a resource's row.
type ChangeKind int

const (
	// ChangeNone leaves the store untouched.
	ChangeNone ChangeKind = iota
	// ChangeInsert replaces any lock on the resource with Change.Lock and a
	// new fencing token, larger than every token the store has handed out,
	// on any resource (tokens never repeat, and grow in the order of the
	// writes): the resource changes hands.
	ChangeInsert
	// ChangeExtend sets the current lock's expiry to Change.Lock.ExpiresAt,
	// earlier or later, keeping its owner, acquisition time and token.
	ChangeExtend
)

// Change is the outcome of a Decide function.
type Change struct {
	Kind ChangeKind
	// Lock is the new lock for ChangeInsert (the store assigns its Token),
	// and carries the new ExpiresAt for ChangeExtend.
	Lock domain.Lock
}

// Decide returns the change to apply to the current lock on a resource (nil
// when none), or an error to abort. A store may call it again for one
// Update (a rolled-back transaction); only its last decision stands.
type Decide func(current *domain.Lock) (Change, error)

// OpKind names a decision that a OneStatement store may carry out.
type OpKind int

const (
	OpAcquire    OpKind = iota + 1 // Acquire's rule, DecideAcquire
	OpTake                         // Take's rule, DecideTake
	OpRenew                        // Renew's rule, DecideRenew
	OpRenewToken                   // a handle's renewal, DecideRenewToken
)

// Op is one decision of the service on one resource.
type Op struct {
	Kind  OpKind
	Owner string // the caller
	Ref   domain.ResourceRef
	// Held is, for OpRenewToken, the handle's acquisition as it last knew
	// it: only the row of its Token and Owner may be extended.
	Held domain.Lock
	// At gives the time of the decision and the new expiry, now+TTL; a
	// store calls it as close to its write as it can.
	At func() (now, expires time.Time)
}

// Decide is op's rule in Go: its change to cur, the lock stored on op.Ref.
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
// another owner holds it. A re-entry extends owner's active lock to the
// later of its expiry and expires: whoever keeps it alive at its own TTL
// must not lose it to the same owner's re-entry with a shorter one.
func DecideAcquire(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	switch {
	case cur == nil || cur.ExpiredAt(now):
		// Changes hands, even back to the same owner (who held nothing
		// since the expiry): a new token.
		return Change{Kind: ChangeInsert, Lock: domain.Lock{
			Owner: owner, Resource: ref, AcquiredAt: now, ExpiresAt: expires,
		}}, nil
	case cur.Owner == owner:
		if cur.ExpiresAt.After(expires) {
			expires = cur.ExpiresAt
		}
		return Change{Kind: ChangeExtend, Lock: domain.Lock{ExpiresAt: expires}}, nil
	default:
		return Change{}, &domain.LockConflictError{Holder: *cur, Now: now}
	}
}

// DecideTake is Take's rule: like DecideAcquire, but an active lock of any
// owner refuses the Take with a *domain.LockConflictError naming it
// (SameOwner set for owner's own): a handle is one
// acquisition and never shares another's token. (A re-entry inside the
// holder's work, AcquireOptions.Reentrant, never reaches the store.)
func DecideTake(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	if cur == nil || cur.ExpiredAt(now) {
		return Change{Kind: ChangeInsert, Lock: domain.Lock{
			Owner: owner, Resource: ref, AcquiredAt: now, ExpiresAt: expires,
		}}, nil
	}
	return Change{}, &domain.LockConflictError{Holder: *cur, Now: now, SameOwner: cur.Owner == owner}
}

// DecideRenew is Renew's rule: owner's active lock cur on ref extended to
// expires (now+TTL); a *domain.LockExpiredError when owner holds nothing
// there at now; a *domain.LockConflictError when another owner does.
func DecideRenew(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	switch {
	case cur == nil:
		return Change{}, &domain.LockExpiredError{Owner: owner, Resource: ref}
	case cur.Owner == owner && cur.ExpiredAt(now):
		return Change{}, &domain.LockExpiredError{Owner: owner, Resource: ref, ExpiredAt: cur.ExpiresAt}
	case cur.Owner == owner:
		return Change{Kind: ChangeExtend, Lock: domain.Lock{ExpiresAt: expires}}, nil
	case cur.ExpiredAt(now):
		return Change{}, &domain.LockExpiredError{Owner: owner, Resource: ref}
	default:
		return Change{}, &domain.LockConflictError{Holder: *cur, Now: now}
	}
}

// DecideRenewToken is a Handle's renewal rule: held, the handle's
// acquisition, extended to expires if cur is that acquisition (same token
// and owner) and active at now; otherwise the loss (LossOf). Unlike
// DecideRenew, it never extends the same owner's lock of another token.
func DecideRenewToken(cur *domain.Lock, held domain.Lock, now, expires time.Time) (Change, error) {
	if lost := LossOf(held, cur, now); lost != nil {
		return Change{}, lost
	}
	return Change{Kind: ChangeExtend, Lock: domain.Lock{ExpiresAt: expires}}, nil
}

// overDead is cur as an acquire decides on it once the probe found
// holder's process gone: none (and gone) if cur is still holder's active
// lock, else cur as it is, changed since the probe.
func overDead(holder domain.Lock, cur *domain.Lock, now time.Time) (_ *domain.Lock, gone bool) {
	if cur != nil && cur.Token == holder.Token && !cur.ExpiredAt(now) {
		return nil, true
	}
	return cur, false
}

// lateWrite refuses l, written for owner on ref, if it has expired by now,
// when the store returned it: the store took longer than the TTL.
func lateWrite(l domain.Lock, owner string, ref domain.ResourceRef, now time.Time) error {
	if l.ExpiredAt(now) {
		return &domain.LockExpiredError{Owner: owner, Resource: ref, ExpiredAt: l.ExpiresAt, WrittenAt: now}
	}
	return nil
}

// LossOf says whether, and why, held is lost at now, given cur, the lock
// stored on its resource: nil while cur is held itself, active; otherwise
// a *domain.LockLostError: taken over (another token, cur as NewHolder),
// expired (its own row, or no row past held's expiry), or removed.
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

// lossOnRead is LossOf on what a read of held's resource returned at now.
// A store that cannot be read is no proof of loss before held's expiry:
// nil and err then.
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

// lossOfRelease is the loss of held, whose release by token at now removed
// nothing, given what a read of its resource said afterwards (lossOnRead).
func lossOfRelease(held domain.Lock, lost *domain.LockLostError, readErr error, now time.Time) *domain.LockLostError {
	switch {
	case lost != nil:
		return lost
	case readErr != nil:
		// Why is unknown, but not whether: the removal found no active
		// lock of this token.
		reason := domain.LostRemoved
		if held.ExpiredAt(now) {
			reason = domain.LostExpired
		}
		return &domain.LockLostError{Lock: held, Reason: reason, At: now}
	}
	// Active after a removal that found it expired: a clock went back.
	return &domain.LockLostError{Lock: held, Reason: domain.LostExpired, At: now}
}

// lateRenewal turns a handle's renewal of held written only after the lock
// had expired (lateWrite) into its loss to a failing store.
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
