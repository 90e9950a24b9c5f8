package application_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// testPlan is the embedder's plan in these tests.
type testPlan struct {
	Phase string
	Runs  int
}

type planFixture struct {
	locks *application.LockService
	repo  *memory.LockRepository
	plans *memory.PlanStore[testPlan]
}

func newPlanFixture(t *testing.T, clk application.Clock) *planFixture {
	t.Helper()
	repo := memory.NewLockRepository()
	svc, err := application.NewLockService(repo, clk, 0)
	require.NoError(t, err)
	plans := memory.NewPlanStore[testPlan](repo, clk)
	plans.Put("p1", testPlan{Phase: "draft"})
	return &planFixture{locks: svc, repo: repo, plans: plans}
}

func (f *planFixture) lifecycle(t *testing.T, owner string, opts application.PlanLockOptions) *application.PlanLifecycleService[testPlan] {
	t.Helper()
	s, err := application.NewPlanLifecycleService[testPlan](f.locks, f.plans, owner, opts)
	require.NoError(t, err)
	return s
}

func (f *planFixture) plan(t *testing.T) testPlan {
	t.Helper()
	p, err := f.plans.Load(context.Background(), "p1")
	require.NoError(t, err)
	return p
}

func TestPlanLifecycleService_Transition(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	planRef := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}
	execute := func(_ context.Context, p testPlan) (testPlan, error) {
		p.Phase, p.Runs = "execute", p.Runs+1
		return p, nil
	}

	t.Run("PersistsUnderTheLockThenReleases", func(t *testing.T) {
		f := newPlanFixture(t, testclock.New(holdStart))
		s := f.lifecycle(t, "A", application.PlanLockOptions{})
		got, err := s.Transition(ctx, "p1", func(ctx context.Context, p testPlan) (testPlan, error) {
			l, err := f.locks.Get(ctx, planRef)
			require.NoError(t, err)
			assert.Equal(t, "A", l.Owner, "the plan is locked while the transition runs")
			return execute(ctx, p)
		})
		require.NoError(t, err)
		assert.Equal(t, testPlan{Phase: "execute", Runs: 1}, got)
		assert.Equal(t, got, f.plan(t))
		_, err = f.locks.Get(ctx, planRef)
		require.ErrorIs(t, err, domain.ErrNotFound, "released after persistence")
	})

	t.Run("PausedHolderIsRefusedAtPersist", func(t *testing.T) {
		// A's process is paused (its timers stand still) past its lock's
		// expiry; B takes the plan over and A wakes up to persist.
		clk := testclock.New(holdStart)
		clk.Pause() // from the start: no timer of A's fires
		f := newPlanFixture(t, clk)
		s := f.lifecycle(t, "A", application.PlanLockOptions{TTL: 10 * time.Second})
		var b domain.Lock
		_, err := s.Transition(ctx, "p1", func(ctx context.Context, p testPlan) (testPlan, error) {
			clk.BlockUntil(t, 1) // A's keep-alive waits to renew, in vain
			clk.Add(11 * time.Second)
			var err error
			b, err = f.locks.Acquire(ctx, "B", planRef, time.Minute)
			require.NoError(t, err, "B takes the expired lock")
			return execute(ctx, p)
		})
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		assert.Equal(t, b, *lost.NewHolder)
		assert.Contains(t, err.Error(), `owner "B" took it over`)
		assert.Equal(t, testPlan{Phase: "draft"}, f.plan(t), "nothing persisted")
		cur, err := f.locks.Get(ctx, planRef)
		require.NoError(t, err)
		assert.Equal(t, b, cur, "and B's lock is untouched by A's release")
	})

	t.Run("LostBeforePersistPersistsNothing", func(t *testing.T) {
		clk := testclock.New(holdStart)
		repo := &flakyRepo{LockRepository: memory.NewLockRepository()}
		svc, err := application.NewLockService(repo, clk, 0)
		require.NoError(t, err)
		plans := memory.NewPlanStore[testPlan](repo.LockRepository, clk)
		plans.Put("p1", testPlan{Phase: "draft"})
		s, err := application.NewPlanLifecycleService[testPlan](svc, plans, "A", application.PlanLockOptions{TTL: 10 * time.Second})
		require.NoError(t, err)
		_, err = s.Transition(ctx, "p1", func(ctx context.Context, p testPlan) (testPlan, error) {
			repo.failWith(func(context.Context) error { return &domain.StoreError{Op: "renew", Kind: domain.StoreBusy} })
			require.Equal(t, 5*time.Second, clk.NextTimer(t))
			clk.Add(5 * time.Second)
			for ctx.Err() == nil {
				select {
				case d := <-clk.Timers():
					if d < 2*time.Second {
						clk.Add(d)
					}
				case <-time.After(10 * time.Millisecond):
				}
			}
			repo.failWith(nil)
			return execute(ctx, p) // ignores the loss: the service must not persist
		})
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, domain.LostStoreFailing, lost.Reason)
		p, err := plans.Load(ctx, "p1")
		require.NoError(t, err)
		assert.Equal(t, testPlan{Phase: "draft"}, p, "nothing persisted")
	})

	t.Run("LongTransitionKeepsItsLock", func(t *testing.T) {
		clk := testclock.New(holdStart)
		f := newPlanFixture(t, clk)
		ttl := 10 * time.Second
		s := f.lifecycle(t, "A", application.PlanLockOptions{TTL: ttl})
		got, err := s.Transition(ctx, "p1", func(ctx context.Context, p testPlan) (testPlan, error) {
			// Each cycle sets two timers of TTL/2, in this order: the wait
			// for the renewal, then the renewal's guard (the lock's expiry,
			// TTL/2 away when it starts). Reading both before moving on
			// means the clock moves only once the next wait is set; a test
			// that took the guard for the next wait raced the keep-alive.
			for i := 1; i <= 8; i++ { // four TTLs of work
				require.Equal(t, ttl/2, clk.NextTimer(t), "the wait for renewal %d", i)
				clk.Add(ttl / 2)
				require.Equal(t, ttl/2, clk.NextTimer(t), "renewal %d's guard", i)
				require.Eventually(t, func() bool {
					l, err := f.locks.Get(ctx, planRef)
					return err == nil && l.ExpiresAt.Equal(holdStart.Add(time.Duration(i)*ttl/2+ttl))
				}, 10*time.Second, time.Millisecond, "renewal %d", i)
				_, err := f.locks.Acquire(ctx, "B", planRef, 0)
				require.ErrorIs(t, err, domain.ErrConflict, "still held after %s", time.Duration(i)*ttl/2)
			}
			return execute(ctx, p)
		})
		require.NoError(t, err)
		assert.Equal(t, got, f.plan(t))
	})

	t.Run("ReleasedAfterErrorAndPanic", func(t *testing.T) {
		f := newPlanFixture(t, testclock.New(holdStart))
		s := f.lifecycle(t, "A", application.PlanLockOptions{})
		mine := errors.New("the model refused")
		_, err := s.TransitionWithProject(ctx, "proj", "p1", func(context.Context, testPlan) (testPlan, error) {
			return testPlan{}, mine
		})
		require.ErrorIs(t, err, mine)
		require.PanicsWithValue(t, "boom", func() {
			_, _ = s.TransitionWithProject(ctx, "proj", "p1", func(context.Context, testPlan) (testPlan, error) { panic("boom") })
		})
		all, err := f.locks.List(ctx, application.ListOptions{IncludeExpired: true})
		require.NoError(t, err)
		assert.Empty(t, all, "both locks released")
		assert.Equal(t, testPlan{Phase: "draft"}, f.plan(t))
	})

	t.Run("WaitTimeoutNamesTheHolder", func(t *testing.T) {
		clk := testclock.New(holdStart)
		f := newPlanFixture(t, clk)
		holder, err := f.locks.Acquire(ctx, "B", planRef, time.Hour)
		require.NoError(t, err)
		s := f.lifecycle(t, "A", application.PlanLockOptions{WaitTimeout: 30 * time.Second})
		done := make(chan error, 1)
		go func() { _, err := s.Transition(ctx, "p1", execute); done <- err }()
		require.Equal(t, 30*time.Second, clk.NextTimer(t))
		clk.NextTimer(t) // the first poll
		clk.Add(30 * time.Second)
		err = <-done
		var conflict *domain.LockConflictError
		require.ErrorAs(t, err, &conflict)
		assert.Equal(t, holder, conflict.Holder)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})

	t.Run("ProjectAndPlanTransitionsDoNotDeadlock", func(t *testing.T) {
		f := newPlanFixture(t, clock.New())
		for i := range 4 {
			f.plans.Put(fmt.Sprint("p", i), testPlan{})
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := f.lifecycle(t, fmt.Sprint("owner-", g), application.PlanLockOptions{})
				for i := range 25 {
					plan := fmt.Sprint("p", (g+i)%4)
					var err error
					if (g+i)%2 == 0 {
						_, err = s.TransitionWithProject(wctx, "proj", plan, execute)
					} else {
						_, err = s.Transition(wctx, plan, execute)
					}
					if err != nil {
						t.Errorf("owner-%d, transition %d: %v", g, i, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		total := 0
		for i := range 4 {
			p, err := f.plans.Load(ctx, fmt.Sprint("p", i))
			require.NoError(t, err)
			total += p.Runs
		}
		assert.Equal(t, 8*25, total, "every transition persisted once: no lost update")
	})

	t.Run("BadInput", func(t *testing.T) {
		f := newPlanFixture(t, testclock.New(holdStart))
		_, err := application.NewPlanLifecycleService[testPlan](f.locks, f.plans, "", application.PlanLockOptions{})
		require.ErrorIs(t, err, domain.ErrValidation)
		_, err = application.NewPlanLifecycleService[testPlan](f.locks, f.plans, "A", application.PlanLockOptions{TTL: time.Second})
		require.ErrorIs(t, err, domain.ErrValidation)
		s := f.lifecycle(t, "A", application.PlanLockOptions{})
		_, err = s.Transition(ctx, "", execute)
		require.ErrorIs(t, err, domain.ErrValidation)
	})
}
