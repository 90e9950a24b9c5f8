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

// renewToken renews held, a handle's acquisition, by its token
// (OpRenewToken): never through an owner-scoped write.
func (s *LockService) renewToken(ctx context.Context, held domain.Lock, ttl time.Duration) (domain.Lock, error) {
	owner, ref := held.Owner, held.Resource
	op := Op{Kind: OpRenewToken, Owner: owner, Ref: ref, Held: held}
	out, err := s.apply(ctx, owner, ref, ttl, op.Decide, &op)
	l := out.Lock
	err = lateRenewal(held, err)
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
	lost, err := s.lossNow(ctx, held)
	return false, lossOfRelease(held, lost, err, now)
}

// lossNow reads the lock on held's resource and says whether, and why,
// held is lost now (lossOnRead).
func (s *LockService) lossNow(ctx context.Context, held domain.Lock) (*domain.LockLostError, error) {
	cur, err := s.repo.Get(ctx, held.Resource)
	return lossOnRead(held, cur, err, s.Now())
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
	lost, err := lossOnRead(held, cur, err, s.Now())
	switch {
	case lost != nil:
		return domain.Lock{}, lost
	case err != nil:
		return domain.Lock{}, err
	}
	return cur, nil
}
