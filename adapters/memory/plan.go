package memory

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// PlanStore keeps plans of type P in memory, fenced by the locks of a
// LockRepository: the test double of application.PlanStore. Persist checks
// and writes under the repository's mutex, so that no lock changes hands
// in between, as a SQL store's transaction ensures.
type PlanStore[P any] struct {
	locks *LockRepository
	clock application.Clock

	mu    sync.Mutex
	plans map[string]P
}

var _ application.PlanStore[int] = (*PlanStore[int])(nil)

// NewPlanStore returns an empty store fenced by locks, on clock.
func NewPlanStore[P any](locks *LockRepository, clock application.Clock) *PlanStore[P] {
	return &PlanStore[P]{locks: locks, clock: clock, plans: make(map[string]P)}
}

// Put stores plan unfenced, to set up tests.
func (s *PlanStore[P]) Put(planID string, plan P) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.plans[planID] = plan
}

// Load implements application.PlanStore.
func (s *PlanStore[P]) Load(ctx context.Context, planID string) (P, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.plans[planID]
	if err := ctx.Err(); err != nil {
		return p, err
	}
	if !ok {
		return p, fmt.Errorf("plan %q: %w", planID, domain.ErrNotFound)
	}
	return p, nil
}

// Persist implements application.PlanStore.
func (s *PlanStore[P]) Persist(ctx context.Context, planID string, plan P, fences []application.Fence) error {
	if err := s.locks.lock(ctx); err != nil {
		return err
	}
	defer s.locks.mu.Unlock()
	now := stored(s.clock.Now())
	for _, f := range fences {
		if err := checkFence(s.locks.locks[f.Resource], f, now); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.plans[planID] = plan
	return nil
}

// checkFence reports whether cur (zero for none) is f's lock, unexpired.
func checkFence(cur domain.Lock, f application.Fence, now time.Time) error {
	if cur.Token == f.Token && cur.Owner == f.Owner && !cur.ExpiredAt(now) {
		return nil
	}
	held := domain.Lock{Token: f.Token, Owner: f.Owner, Resource: f.Resource}
	if cur.Token == f.Token {
		held = cur
	}
	if cur.Token != 0 && cur.Token != f.Token && !cur.ExpiredAt(now) {
		return &domain.LockLostError{Lock: held, Reason: domain.LostTakenOver, At: now, NewHolder: &cur}
	}
	return &domain.LockLostError{Lock: held, Reason: domain.LostExpired, At: now}
}
