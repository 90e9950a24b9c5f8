package application

import (
	"context"
	"errors"
	"time"

	"github.com/cleveragents/locks/domain"
)

// Fence is what a plan store checks as it persists: that Owner still holds
// Resource with Token, unexpired, so a paused holder cannot overwrite.
type Fence struct {
	Resource domain.ResourceRef // the locked resource the write belongs to
	Owner    string             // the owner that must still hold it
	// Token is the acquisition that must still hold it: a later one, even
	// by the same owner, fails the check.
	Token int64
}

// FenceOf returns the fence of a held lock.
func FenceOf(l domain.Lock) Fence { return Fence{Resource: l.Resource, Owner: l.Owner, Token: l.Token} }

// PlanStore loads and persists the embedder's plans.
type PlanStore[P any] interface {
	Load(ctx context.Context, planID string) (P, error) // the plan with id planID
	// Persist writes plan in one transaction that first checks every fence on
	// the locks' database. Errors: *domain.LockLostError (matching
	// domain.ErrExpired) for a fence that does not hold, naming the new holder.
	Persist(ctx context.Context, planID string, plan P, fences []Fence) error
}

// PlanLockOptions tune how PlanLifecycleService takes its locks.
type PlanLockOptions struct {
	TTL time.Duration // bounds how long a crashed process blocks the plan (zero: the default)
	// WaitTimeout bounds each lock's wait on the service's clock (zero: ctx does).
	WaitTimeout time.Duration
}

// PlanLifecycleService runs plan transitions under the plan's lock, and the
// project's first (always in that order: no deadlock), kept alive, then
// persists the plan fenced by them and releases them; a lock lost before the
// persist persists nothing. A plan's transitions are serialised in a process
// too; one nested in another's on the same plan is refused.
type PlanLifecycleService[P any] struct {
	locks *LockService
	store PlanStore[P]
	owner string
	opts  PlanLockOptions
}

// NewPlanLifecycleService runs transitions for owner with locks and store.
// Errors: *domain.ValidationError for a bad owner, TTL or timeout.
func NewPlanLifecycleService[P any](locks *LockService, store PlanStore[P], owner string, opts PlanLockOptions) (*PlanLifecycleService[P], error) {
	if err := domain.ValidateOwner(owner); err != nil {
		return nil, err
	}
	if opts.TTL != 0 {
		if err := domain.ValidateTTL(opts.TTL); err != nil {
			return nil, err
		}
	}
	if opts.WaitTimeout < 0 {
		return nil, &domain.ValidationError{Field: "wait_timeout", Reason: "must not be negative; pass zero to wait as long as the context allows"}
	}
	return &PlanLifecycleService[P]{locks: locks, store: store, owner: owner, opts: opts}, nil
}

// Transition runs fn on plan planID under its lock and persists its result;
// fn's context ends the moment a lock is lost.
// Errors (nothing persisted): *domain.ValidationError; *domain.LockConflictError
// naming the holder; *domain.LockLostError; fn's error; the store's errors.
func (s *PlanLifecycleService[P]) Transition(ctx context.Context, planID string, fn func(ctx context.Context, plan P) (P, error)) (P, error) {
	return s.transition(ctx, []domain.ResourceRef{{Type: domain.ResourcePlan, ID: planID}}, planID, fn)
}

// TransitionWithProject is Transition under the project's lock too, taken first.
func (s *PlanLifecycleService[P]) TransitionWithProject(ctx context.Context, projectID, planID string, fn func(ctx context.Context, plan P) (P, error)) (P, error) {
	return s.transition(ctx, []domain.ResourceRef{
		{Type: domain.ResourceProject, ID: projectID},
		{Type: domain.ResourcePlan, ID: planID},
	}, planID, fn)
}

func (s *PlanLifecycleService[P]) transition(ctx context.Context, refs []domain.ResourceRef, planID string,
	fn func(ctx context.Context, plan P) (P, error)) (out P, err error) {
	for _, ref := range refs {
		if err := ref.Validate(); err != nil {
			return out, err
		}
	}
	held := ctx
	handles := make([]*Handle, 0, len(refs))
	defer func() {
		p := recover()
		// Even when ctx has ended: a lock left behind blocks the plan for its whole TTL.
		for i := len(handles) - 1; i >= 0; i-- {
			_, rerr := handles[i].Release(context.WithoutCancel(ctx))
			switch {
			case rerr == nil || errors.Is(rerr, domain.ErrClosed):
			case errors.Is(rerr, domain.ErrExpired) && (err == nil || errors.Is(err, domain.ErrExpired)):
				// Lost after a persist its fences let through, or the loss already reported.
			default:
				err = errors.Join(err, rerr)
			}
		}
		if p != nil {
			panic(p)
		}
	}()
	opts := AcquireOptions{TTL: s.opts.TTL, Wait: true, Timeout: s.opts.WaitTimeout}
	for _, ref := range refs {
		h, err := s.locks.Take(ctx, s.owner, ref, opts)
		if err != nil {
			return out, err
		}
		handles = append(handles, h)
		held = h.KeepAlive(held)
	}

	plan, err := s.store.Load(held, planID)
	if err != nil {
		return out, lostOr(handles, err)
	}
	next, err := fn(held, plan)
	if err != nil {
		return out, lostOr(handles, err)
	}
	if lost := lostErr(handles); lost != nil {
		return out, lost
	}
	fences := make([]Fence, len(handles))
	for i, h := range handles {
		fences[i] = FenceOf(h.Lock())
	}
	if err := s.store.Persist(held, planID, next, fences); err != nil {
		return out, lostOr(handles, err)
	}
	return next, nil
}

// lostErr returns the loss of the first lock of handles that was lost.
func lostErr(handles []*Handle) error {
	for _, h := range handles {
		if err := h.Err(); err != nil {
			return err
		}
	}
	return nil
}

// lostOr joins err with a lock's loss, which says why (a cancelled context follows from it).
func lostOr(handles []*Handle, err error) error {
	if lost := lostErr(handles); lost != nil && !errors.Is(err, lost) {
		return errors.Join(lost, err)
	}
	return err
}
