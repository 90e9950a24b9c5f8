package planstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/planstore"
)

func increment(phase string) func(context.Context, planstore.Plan) (planstore.Plan, error) {
	return func(_ context.Context, p planstore.Plan) (planstore.Plan, error) {
		p.Phase = phase
		p.Counter++
		return p, nil
	}
}

// Through the lifecycle service and the SQL store: a transition persists
// under the plan lock's fence; a holder paused past its expiry, whose plan
// another process took meanwhile, has its persist refused by the store's
// fence, with the new holder named, and the plan is unchanged.
//
// The pause is another process's clock running ahead of A's by ten TTLs:
// for that process, A's lock has long expired and it takes the plan; A's
// own clock has not moved, so nothing in A (its keep-alive, its own
// checks) has noticed, just as a process that was stopped has not yet seen
// the time that passed. Only the fence in the store's transaction stands
// between A and the new holder's plan.
func TestPlanLifecycle_PausedHolderSQLStore(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		clockA, clockB := newMock(), newMock()
		clockB.Add(10 * ttl)
		cA := mustOpen(t, database, "A", clockA)
		cB := mustOpen(t, database, "B", clockB)
		plans := mustPlans(t, database, cA)
		svc, err := application.NewPlanLifecycleService[planstore.Plan](cA.Locks, plans, "A", application.PlanLockOptions{TTL: ttl})
		require.NoError(t, err)

		p, err := svc.Transition(ctx, plan1.ID, increment("planned"))
		require.NoError(t, err)
		assert.EqualValues(t, 1, p.Counter)
		persisted := mustLoad(t, plans, plan1.ID)
		require.Equal(t, "planned", persisted.Phase)
		require.Positive(t, persisted.Token, "persisted under the plan lock's fence")

		var taken domain.Lock
		_, err = svc.Transition(ctx, plan1.ID, func(ctx context.Context, p planstore.Plan) (planstore.Plan, error) {
			// A pauses here; meanwhile B takes the plan.
			var err error
			taken, err = cB.Locks.Acquire(ctx, "B", plan1, ttl)
			require.NoError(t, err)
			return increment("executed")(ctx, p)
		})
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		require.NotNil(t, lost.NewHolder)
		assert.Equal(t, taken, *lost.NewHolder)
		assert.Contains(t, err.Error(), `owner "B" took it over`)
		assert.Equal(t, persisted, mustLoad(t, plans, plan1.ID), "the paused holder's persist must write nothing")

		// A's release at the end of the transition left B's lock alone.
		cur, err := cB.Locks.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, taken, cur)
	})
}

// Transitions that take the project lock and then the plan lock, and
// transitions that take the plan lock alone, run at once from many owners
// over a few plans and projects. They all finish (no deadlock: the context
// bounds the test), and no increment is lost.
func TestPlanLifecycle_ConcurrentTransitionsNoDeadlock(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		const (
			owners      = 8
			transitions = 12
		)
		planIDs := []string{"plan-a", "plan-b", "plan-c"}
		projectIDs := []string{"project-x", "project-y"}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		c := mustOpen(t, database, "host", nil)
		plans := mustPlans(t, database, c)
		for _, id := range planIDs {
			require.NoError(t, plans.Create(ctx, planstore.Plan{ID: id, Phase: "draft"}))
		}

		var wg sync.WaitGroup
		errs := make(chan error, owners*transitions)
		for o := range owners {
			svc, err := application.NewPlanLifecycleService[planstore.Plan](c.Locks, plans, fmt.Sprintf("owner-%d", o),
				application.PlanLockOptions{TTL: time.Minute})
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range transitions {
					plan := planIDs[(o+i)%len(planIDs)]
					var err error
					if (o+i)%2 == 0 {
						_, err = svc.TransitionWithProject(ctx, projectIDs[(o*3+i)%len(projectIDs)], plan, increment("with-project"))
					} else {
						_, err = svc.Transition(ctx, plan, increment("plan-only"))
					}
					if err != nil {
						errs <- fmt.Errorf("owner %d, transition %d on %s: %w", o, i, plan, err)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("transitions did not finish in time, a deadlock? %v", err)
			}
			t.Error(err)
		}
		var total int64
		for _, id := range planIDs {
			total += mustLoad(t, plans, id).Counter
		}
		assert.EqualValues(t, owners*transitions, total, "every transition's increment is persisted, none lost")
	})
}
