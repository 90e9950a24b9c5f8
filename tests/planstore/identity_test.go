package planstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/planstore"
)

// Issue 19, item 2: A's lock is removed, B takes the plan and moves it, A
// takes the plan again (a new token). A's first, stale handle must not
// adopt the new token: its renewal is a loss, and its fence refuses, so it
// cannot persist over B's work.
func TestHandle_StaleHandleCannotPersist(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		mc := newMock()
		cA := mustOpen(t, database, "A", mc)
		cB := mustOpen(t, database, "B", mc)
		plans := mustPlans(t, database, cA)

		stale, err := cA.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: ttl})
		require.NoError(t, err)
		_, err = cA.Locks.Release(ctx, "A", plan1) // removed behind the handle's back
		require.NoError(t, err)
		svcB, err := application.NewPlanLifecycleService[planstore.Plan](cB.Locks, plans, "B", application.PlanLockOptions{TTL: ttl})
		require.NoError(t, err)
		_, err = svcB.Transition(ctx, plan1.ID, increment("by-b"))
		require.NoError(t, err)
		moved := mustLoad(t, plans, plan1.ID)
		again, err := cA.Locks.Acquire(ctx, "A", plan1, ttl)
		require.NoError(t, err)

		_, err = stale.Renew(ctx)
		require.ErrorIs(t, err, domain.ErrExpired, "the stale handle's renewal is a loss")
		assert.NotEqual(t, again.Token, stale.Lock().Token, "the stale handle never adopts the new token")
		err = plans.Persist(ctx, plan1.ID, planstore.Plan{ID: plan1.ID, Phase: "stale", Counter: 99},
			[]application.Fence{application.FenceOf(stale.Lock())})
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost, "the stale handle's fence refuses")
		assert.Equal(t, moved, mustLoad(t, plans, plan1.ID), "B's work stands")
	})
}

// Issue 19, item 3: two transitions of one plan in one process, built as
// docs/lifecycle.md shows (owner c.Owner()), run one after the other.
func TestPlanLifecycle_SerialisedInProcess(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		c := mustOpen(t, database, "", newMock())
		plans := mustPlans(t, database, c)
		svc, err := application.NewPlanLifecycleService[planstore.Plan](c.Locks, plans, c.Owner(), application.PlanLockOptions{TTL: ttl})
		require.NoError(t, err)

		var inside atomic.Int32
		entered, proceed := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := svc.Transition(ctx, plan1.ID, func(ctx context.Context, p planstore.Plan) (planstore.Plan, error) {
				inside.Add(1)
				defer inside.Add(-1)
				close(entered)
				<-proceed
				return increment("first")(ctx, p)
			})
			first <- err
		}()
		<-entered
		second := make(chan error, 1)
		go func() {
			_, err := svc.Transition(ctx, plan1.ID, func(ctx context.Context, p planstore.Plan) (planstore.Plan, error) {
				if inside.Add(1) != 1 {
					t.Error("two transitions of one plan ran at once")
				}
				defer inside.Add(-1)
				return increment("second")(ctx, p)
			})
			second <- err
		}()
		require.Eventually(t, func() bool { return c.Locks.Waiting(plan1) == 1 }, 10*time.Second, time.Millisecond,
			"the second transition waits for the first")
		close(proceed)
		require.NoError(t, <-first)
		require.NoError(t, <-second)
		assert.EqualValues(t, 2, mustLoad(t, plans, plan1.ID).Counter)
	})
}
