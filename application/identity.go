package application

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/domain"
)

// A Handle acts for one acquisition: what it renews, releases and checks
// is named by its token. The service's owner-scoped calls stay as the
// spec has them; these are the token-scoped ones that handles use.

// renewToken renews held, a handle's acquisition, by its token: in one
// write when the store can (TokenRenewer), and otherwise, or when that
// write extended nothing, through Update with DecideRenewToken. It never
// falls back to an owner-scoped write.
func (s *LockService) renewToken(ctx context.Context, held domain.Lock, ttl time.Duration) (domain.Lock, error) {
	owner, ref := held.Owner, held.Resource
	rule := func(cur *domain.Lock, now, expires time.Time) (Change, error) {
		return DecideRenewToken(cur, held, now, expires)
	}
	var (
		l   domain.Lock
		err error
	)
	if s.tokenRenewer == nil {
		l, err = s.update(ctx, owner, ref, ttl, rule)
	} else {
		l, err = s.write(ctx, owner, ref, ttl, func(ttl time.Duration) (domain.Lock, error) {
			l, err := s.tokenRenewer.RenewTokenAt(ctx, ref, owner, held.Token, s.timing(ttl))
			if errors.Is(err, ErrUndecided) {
				return s.repo.Update(ctx, ref, s.decideNow(ttl, rule))
			}
			return l, err
		})
	}
	var (
		slow *domain.LockExpiredError
		lost *domain.LockLostError
	)
	if errors.As(err, &slow) && !errors.As(err, &lost) {
		// Extended, but only after the lock had expired: of no use.
		err = &domain.LockLostError{Lock: held, Reason: domain.LostStoreFailing, At: slow.WrittenAt, Err: slow}
	}
	if err == nil && l.Token != held.Token {
		// A store that broke its contract: never adopt the token.
		err = &domain.StoreError{Op: "renew lock on " + ref.String(),
			Err: fmt.Errorf("renewed token %d for a handle of token %d", l.Token, held.Token)}
	}
	if s.observer != nil && !errors.Is(err, domain.ErrValidation) && !errors.Is(err, domain.ErrClosed) {
		e := Event{Kind: EventRenewed, Owner: owner, Resource: ref, Lock: l}
		if err != nil {
			e.Kind, e.Err = EventRenewFailed, err
		}
		s.observer.Observe(ctx, e)
	}
	if err != nil {
		return domain.Lock{}, err
	}
	return l, nil
}

// releaseToken removes held, a handle's acquisition, by its token, if it
// is active now, and reports whether it did. A release that removes
// nothing returns the loss: as the store shows it, or, when the store
// cannot be read, removed (or expired, past the lock's expiry).
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
	// Nothing removed: the lock was not this acquisition's, active, at now.
	lost, err := s.lossNow(ctx, held)
	switch {
	case lost != nil:
		return false, lost
	case err != nil:
		// Why is unknown, but not whether: the removal found no active
		// lock of this token, so it is lost. An active lock is taken over
		// only once removed (or its holder found gone).
		reason := domain.LostRemoved
		if held.ExpiredAt(now) {
			reason = domain.LostExpired
		}
		return false, &domain.LockLostError{Lock: held, Reason: reason, At: now}
	}
	// The store shows the lock active, after a removal that found it
	// expired: only a clock that went back could do that.
	return false, &domain.LockLostError{Lock: held, Reason: domain.LostExpired, At: now}
}

// lossNow reads the lock on held's resource and says whether, and why,
// held is lost now (LossOf). A store that cannot be read is no proof of
// loss before held's expiry: nil and the error then; after it, the loss.
func (s *LockService) lossNow(ctx context.Context, held domain.Lock) (*domain.LockLostError, error) {
	cur, err := s.repo.Get(ctx, held.Resource)
	now := s.Now()
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

// checkToken returns the lock stored on held's resource if it is still
// held, the acquisition of held's token, active: what a re-entered handle
// renews, without moving its expiry. Otherwise the loss (LossOf); a store
// that cannot be read is no proof of loss before held's expiry (its error
// then).
func (s *LockService) checkToken(ctx context.Context, held domain.Lock) (domain.Lock, error) {
	if err := s.gate.enter(); err != nil {
		return domain.Lock{}, err
	}
	defer s.gate.leave()
	cur, err := s.repo.Get(ctx, held.Resource)
	now := s.Now()
	switch {
	case err == nil:
		if lost := LossOf(held, &cur, now); lost != nil {
			return domain.Lock{}, lost
		}
		return cur, nil
	case errors.Is(err, domain.ErrNotFound):
		return domain.Lock{}, LossOf(held, nil, now)
	case held.ExpiredAt(now):
		return domain.Lock{}, &domain.LockLostError{Lock: held, Reason: domain.LostExpired, At: now}
	}
	return domain.Lock{}, err
}
