package application_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// rowHeldRepo is the memory store as a store on PostgreSQL answers while
// the holder's fenced transaction runs on past its lock's expiry: every
// take is refused with a conflict whose holder has expired (RowHeld),
// until the test ends the transaction.
type rowHeldRepo struct {
	*memory.LockRepository
	holder domain.Lock
	held   atomic.Bool
	tries  atomic.Int64
}

func (r *rowHeldRepo) Apply(ctx context.Context, op application.Op) (application.Outcome, error) {
	if op.Kind != application.OpTake {
		return application.Outcome{}, nil
	}
	r.tries.Add(1)
	if now, _ := op.At(); r.held.Load() {
		return application.Outcome{}, &domain.LockConflictError{Holder: r.holder, Now: now, RowHeld: true}
	}
	return application.Outcome{}, nil
}

// A wait refused by a lock that has expired but cannot change hands yet
// has no expiry to sleep until: it looks again after a pause, as it polls
// any holder of another process, where it used to try again at once, as
// fast as the store answered (a store whose session sets a short
// lock_timeout answers a refusal in a millisecond).
func TestLockService_WaitBehindAnExpiredRowHeldLockPolls(t *testing.T) {
	ctx := context.Background()
	mc := clock.NewMock()
	mc.Set(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	repo := &rowHeldRepo{LockRepository: memory.NewLockRepository(),
		holder: domain.Lock{Token: 7, Owner: "A", Resource: plan, AcquiredAt: mc.Now().Add(-2 * time.Minute), ExpiresAt: mc.Now().Add(-time.Minute)}}
	repo.held.Store(true)
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)

	got := make(chan error, 1)
	go func() {
		h, err := svc.Take(ctx, "B", plan, application.AcquireOptions{TTL: time.Minute, Wait: true})
		if err == nil {
			_, err = h.Release(ctx)
		}
		got <- err
	}()
	require.Eventually(t, func() bool { return repo.tries.Load() >= 1 }, 10*time.Second, time.Millisecond)
	time.Sleep(200 * time.Millisecond) // real time, in which the mock clock stands still
	assert.LessOrEqual(t, repo.tries.Load(), int64(2), "the wait tried again without a pause")

	// The transaction ends; the next look, after the pause, takes the lock.
	repo.held.Store(false)
	for {
		select {
		case err := <-got:
			require.NoError(t, err)
			return
		case <-time.After(10 * time.Millisecond):
			mc.Add(100 * time.Millisecond)
		}
	}
}
