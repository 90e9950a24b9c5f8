package application_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// slowRepo returns from each Update a little after its decision, in real
// time: the window between a waiter's look at the clock and the timer it
// then sets, which a test's move of the clock may fall into.
type slowRepo struct {
	*memory.LockRepository
	after time.Duration
}

func (r slowRepo) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	l, err := r.LockRepository.Update(ctx, ref, decide)
	time.Sleep(r.after)
	return l, err
}

// untilParked waits in real time until svc says n callers wait for ref.
func untilParked(t *testing.T, svc *application.LockService, ref domain.ResourceRef, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); svc.Waiting(ref) != n; runtime.Gosched() {
		require.True(t, time.Now().Before(deadline), "Waiting(%s) is %d, never %d", ref, svc.Waiting(ref), n)
	}
}

// The waiter behind a head that times out is counted while it waits for
// its turn; the move that times the head out makes it the head, and it
// reads the clock for its first look while the test's next move may be
// under way. Once Waiting said 1, that next move reaches it: it does not
// set its timer from the instant before the move.
func TestLockService_Waiting_BehindAHeadThatTimesOut(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(holdStart)
	svc := newHoldService(t, slowRepo{memory.NewLockRepository(), 5 * time.Millisecond}, clk)
	for i := range 20 {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "behind-" + string(rune('a'+i))}
		_, err := svc.Acquire(ctx, "other", ref, 30*time.Second)
		require.NoError(t, err)
		head, behind := make(chan error, 1), make(chan error, 1)
		do := func(out chan<- error, timeout time.Duration) {
			out <- svc.Do(ctx, "me", ref, application.AcquireOptions{Wait: true, Timeout: timeout},
				func(context.Context, domain.Lock) error { return nil })
		}
		go do(head, 10*time.Second)
		untilParked(t, svc, ref, 1)
		go do(behind, 0)
		untilParked(t, svc, ref, 2)
		clk.Add(10 * time.Second) // the head times out; the other comes to the head
		untilParked(t, svc, ref, 1)
		time.Sleep(2 * time.Millisecond) // a test may move the clock at any time after
		clk.Add(25 * time.Second)        // 5s past the holder's expiry
		select {
		case err := <-behind:
			require.NoError(t, err, "round %d", i)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: hung; Waiting=%d, timers pending: %v", i, svc.Waiting(ref), clk.PendingIn())
		}
		require.ErrorIs(t, <-head, context.DeadlineExceeded)
	}
}
