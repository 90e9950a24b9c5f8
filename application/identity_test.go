package application_test

import (
	"context"
	"fmt"
	"log"
	"runtime"
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
)

// Issue 19, item 6: a lock taken over as a dead holder's had not expired:
// the loss must not say it had.
func TestHandle_DeadHolderTakeoverMessage(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	dead := domain.ProcessOwner{Host: "h", PID: 7, Nonce: "0a1b2c3d",
		BootID: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", PIDNamespace: 1, StartTime: 9}.String()
	mc := clock.NewMock()
	mc.Set(holdStart)
	// The holder's process is taken for gone.
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0, application.WithProcesses(&goneProcesses{}))
	require.NoError(t, err)
	h, err := svc.Take(ctx, dead, plan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	b, err := svc.Acquire(ctx, "B", plan, 0)
	require.NoError(t, err)

	_, err = h.Renew(ctx)
	var lost *domain.LockLostError
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, domain.LostTakenOver, lost.Reason)
	assert.Equal(t, b, *lost.NewHolder)
	assert.NotContains(t, err.Error(), "after it expired")
	assert.Contains(t, err.Error(), "before its expiry at 2026-11-30T11:00:00Z")
	assert.Contains(t, err.Error(), "found gone")
	_, err = h.Release(ctx)
	require.ErrorAs(t, err, &lost)
}

// A transition started inside another transition's function on the same
// plan is refused at once (waiting would wait for itself), and the outer
// transition goes on.
func TestPlanLifecycle_NestedTransitionRefused(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	repo, clk := memory.NewLockRepository(), clock.New()
	svc, err := application.NewLockService(repo, clk, 0)
	require.NoError(t, err)
	plans := memory.NewPlanStore[int](repo, clk)
	plans.Put(plan.ID, 0)
	lc, err := application.NewPlanLifecycleService[int](svc, plans, "A", application.PlanLockOptions{})
	require.NoError(t, err)
	got, err := lc.Transition(ctx, plan.ID, func(ctx context.Context, n int) (int, error) {
		_, err := lc.Transition(ctx, plan.ID, func(_ context.Context, n int) (int, error) { return n + 100, nil })
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce)
		assert.True(t, ce.Nested)
		return n + 1, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 1, got)
}

// Two goroutines of one process share a service and an owner (the
// container's, c.Owner()), and each takes the plan's lock as a handle:
// handles exclude each other, so they take turns, and each release frees
// only the releaser's own acquisition.
func ExampleLockService_Do_twoGoroutines() {
	ctx := context.Background()
	svc, err := application.NewLockService(memory.NewLockRepository(), clock.New(), 0)
	if err != nil {
		log.Fatal(err)
	}
	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-42"}
	const owner = "host:1234:cafe" // what c.Owner() returns
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		inside int
		most   int
		tokens = map[int64]bool{}
	)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				err := svc.Do(ctx, owner, plan, application.AcquireOptions{Wait: true},
					func(ctx context.Context, l domain.Lock) error {
						mu.Lock()
						inside++
						most = max(most, inside)
						tokens[l.Token] = true
						mu.Unlock()
						runtime.Gosched() // let the other goroutine try
						mu.Lock()
						inside--
						mu.Unlock()
						return nil
					})
				if err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Println("at most", most, "at once;", len(tokens), "acquisitions")
	// Output:
	// at most 1 at once; 6 acquisitions
}

// A handle past its expiry as it knows it, whose lock the owner renewed
// behind its back (the owner-scoped Renew), still holds that acquisition:
// a second Take of the same owner, which the store would let re-enter it,
// is refused, and never shares the first handle's token.
func TestHandle_SecondTakeNeverSharesAToken(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	mc := clock.NewMock()
	mc.Set(holdStart)
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
	require.NoError(t, err)
	first, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: 10 * time.Second})
	require.NoError(t, err)
	mc.Add(5 * time.Second)
	_, err = svc.Renew(ctx, "A", plan, 10*time.Second) // the owner, not the handle
	require.NoError(t, err)
	mc.Add(5 * time.Second) // past the expiry the handle knows of

	second, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: 10 * time.Second})
	if second != nil {
		assert.NotEqual(t, first.Lock().Token, second.Lock().Token, "two handles share one acquisition")
	}
	var ce *domain.LockConflictError
	require.ErrorAs(t, err, &ce)
	assert.True(t, ce.InProcess)
	assert.Equal(t, first.Lock().Token, ce.Holder.Token)
	ok, err := first.Release(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
}

// Goroutines of one owner taking turns through Do: a Take that comes
// while the previous handle is being released must wait for the release,
// not re-enter the lock in the store and lose it to that release.
func TestHandle_TurnsOfOneOwnerNeverLose(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	svc, err := application.NewLockService(memory.NewLockRepository(), clock.New(), 0)
	require.NoError(t, err)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		tokens = map[int64]int{}
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				err := svc.Do(ctx, "A", plan, application.AcquireOptions{Wait: true}, func(_ context.Context, l domain.Lock) error {
					mu.Lock()
					tokens[l.Token]++
					mu.Unlock()
					return nil
				})
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	assert.Len(t, tokens, 400, "every Do is an acquisition of its own")
}
