package application

import (
	"errors"
	"time"

	"github.com/cleveragents/locks/domain"
)

// The service's rules: pure functions of the lock stored on a resource (nil:
// none) and of now, carried out by a store or checked by locktest.

// ChangeKind says what a Decide function wants done with a resource's row.
type ChangeKind int

const (
	ChangeNone   ChangeKind = iota // leaves the store untouched
	ChangeInsert                   // replaces any lock with Change.Lock and a new, larger token
	ChangeExtend                   // sets the lock's expiry, keeping owner, acquisition time and token
)

// Change is the outcome of a Decide function.
type Change struct {
	Kind ChangeKind  // what to do with the row
	Lock domain.Lock // ChangeInsert's new lock (bar its Token), ChangeExtend's ExpiresAt
}

// Decide returns the change to the current lock (nil: none), or an error to
// abort; a store may call it again (a rolled-back try): the last one stands.
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
	Kind  OpKind                          // the rule
	Owner string                          // the caller
	Ref   domain.ResourceRef              // the resource decided on
	Held  domain.Lock                     // OpRenewToken's acquisition: only its token and owner's row extends
	Note  string                          // OpAcquire's and OpTake's note, stored with a new lock only
	At    func() (now, expires time.Time) // now and now+TTL, called as close to the write as can be
}

// Decide is op's rule in Go: its change to cur, the lock stored on op.Ref.
func (op Op) Decide(cur *domain.Lock, now, expires time.Time) (Change, error) {
	switch op.Kind {
	case OpAcquire:
		return noted(DecideAcquire, op.Note)(cur, op.Owner, op.Ref, now, expires)
	case OpTake:
		return noted(DecideTake, op.Note)(cur, op.Owner, op.Ref, now, expires)
	case OpRenew:
		return DecideRenew(cur, op.Owner, op.Ref, now, expires)
	case OpRenewToken:
		return DecideRenewToken(cur, op.Held, now, expires)
	}
	return Change{}, errors.New("application: an Op of no known kind")
}

// DecideAcquire is Acquire's rule at now, expires = now+TTL: a new lock on a
// free or expired resource; owner's active lock extended, never shortened
// (by a shorter re-entry); else a *domain.LockConflictError naming cur.
func DecideAcquire(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	switch {
	case cur == nil || cur.ExpiredAt(now):
		// Changes hands, even back to the same owner: a new token.
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

// DecideTake is Take's rule: DecideAcquire's, but any active lock refuses,
// owner's own too (SameOwner set): a handle never shares a token.
func DecideTake(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
	if cur == nil || cur.ExpiredAt(now) {
		return Change{Kind: ChangeInsert, Lock: domain.Lock{
			Owner: owner, Resource: ref, AcquiredAt: now, ExpiresAt: expires,
		}}, nil
	}
	return Change{}, &domain.LockConflictError{Holder: *cur, Now: now, SameOwner: cur.Owner == owner}
}

// DecideRenew is Renew's rule: owner's active lock extended, a
// *domain.LockExpiredError if owner holds none, else a *domain.LockConflictError.
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

// DecideRenewToken is a Handle's renewal: held extended if active, else its loss.
func DecideRenewToken(cur *domain.Lock, held domain.Lock, now, expires time.Time) (Change, error) {
	if lost := LossOf(held, cur, now); lost != nil {
		return Change{}, lost
	}
	return Change{Kind: ChangeExtend, Lock: domain.Lock{ExpiresAt: expires}}, nil
}

// noted is decide storing note with the new lock of a change of hands: a
// note belongs to one acquisition, so an extension (a re-entry, a renewal)
// keeps the note stored, whatever the caller passed.
func noted(decide rule, note string) rule {
	if note == "" {
		return decide
	}
	return func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error) {
		c, err := decide(cur, owner, ref, now, expires)
		if c.Kind == ChangeInsert {
			c.Lock.Note = note
		}
		return c, err
	}
}

// overDead is cur once holder's process is found gone: nil if still holder's, active.
func overDead(holder domain.Lock, cur *domain.Lock, now time.Time) (_ *domain.Lock, gone bool) {
	if cur != nil && cur.Token == holder.Token && !cur.ExpiredAt(now) {
		return nil, true
	}
	return cur, false
}

// lateWrite refuses l if the store returned it expired: the write outlasted the TTL.
func lateWrite(l domain.Lock, owner string, ref domain.ResourceRef, now time.Time) error {
	if l.ExpiredAt(now) {
		return &domain.LockExpiredError{Owner: owner, Resource: ref, ExpiredAt: l.ExpiresAt, WrittenAt: now}
	}
	return nil
}

// LossOf is held's loss at now given cur, the lock stored: nil while held
// and active; else taken over (cur as NewHolder), expired, or removed.
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

// lossOnRead is LossOf on a read; an unreadable store proves no loss before expiry.
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

// lossOfRelease is the loss of held after its release removed nothing.
func lossOfRelease(held domain.Lock, lost *domain.LockLostError, readErr error, now time.Time) *domain.LockLostError {
	switch {
	case lost != nil:
		return lost
	case readErr != nil:
		// Why is unknown, but not whether: no active lock had its token.
		reason := domain.LostRemoved
		if held.ExpiredAt(now) {
			reason = domain.LostExpired
		}
		return &domain.LockLostError{Lock: held, Reason: reason, At: now}
	}
	// Active after a removal that found it expired: a clock went back.
	return &domain.LockLostError{Lock: held, Reason: domain.LostExpired, At: now}
}

// lateRenewal makes a renewal written after the expiry a loss, LostStoreFailing.
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
