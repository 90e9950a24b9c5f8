package application_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// readCountingRepo is the memory store that counts the reads of a lock
// (Get), and reports to release, if set, each handle's release.
type readCountingRepo struct {
	*memory.LockRepository
	reads   atomic.Int64
	release func()
	hang    atomic.Bool // the next read hangs until its context ends
}

func (r *readCountingRepo) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	r.reads.Add(1)
	if r.hang.CompareAndSwap(true, false) {
		<-ctx.Done() // a store that does not answer
		return domain.Lock{}, ctx.Err()
	}
	return r.LockRepository.Get(ctx, ref)
}

func (r *readCountingRepo) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	if r.release != nil {
		r.release()
	}
	return r.LockRepository.DeleteToken(ctx, ref, token, now)
}

// watchingHolder is a handle kept alive in a service that hears of other
// processes' releases (wake), beside other, a second service on the same
// store that stands for another process; the clock never moves unasked.
type watchingHolder struct {
	clk   *testclock.Clock
	repo  *readCountingRepo
	wake  *fakeWakeups
	other *application.LockService
	h     *application.Handle
	held  context.Context
}

// eventChan is an observer that hands on every event, from any goroutine.
type eventChan chan application.Event

func (c eventChan) Observe(_ context.Context, e application.Event) { c <- e }

func newWatchingHolder(t *testing.T, opts ...application.Option) *watchingHolder {
	t.Helper()
	w := &watchingHolder{clk: testclock.New(holdStart), repo: &readCountingRepo{LockRepository: memory.NewLockRepository()},
		wake: newFakeWakeups(true)}
	svc := newHoldService(t, w.repo, w.clk, append(opts, application.WithWakeups(w.wake))...)
	w.other = newHoldService(t, w.repo, w.clk)
	var err error
	w.h, err = svc.Take(context.Background(), "A", plan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	w.held = w.h.KeepAlive(context.Background())
	t.Cleanup(func() { _, _ = w.h.Release(context.Background()) })
	select {
	case ref := <-w.wake.watched:
		require.Equal(t, plan, ref)
	case <-time.After(eventBound):
		t.Fatal("the keep-alive does not watch its resource: it hears of a loss only at its next renewal")
	}
	require.Equal(t, 30*time.Second, w.clk.NextTimer(t), "the renewal, at TTL/2")
	return w
}

// ended returns the cause with which held ended, failing if it does not
// end in real time while the clock stands.
func ended(t *testing.T, held context.Context) *domain.LockLostError {
	t.Helper()
	select {
	case <-held.Done():
	case <-time.After(eventBound):
		t.Fatal("the hold did not end on the wake-up: the holder learns of its loss only at its next renewal")
	}
	lost, ok := context.Cause(held).(*domain.LockLostError)
	require.True(t, ok, "the cause is a *domain.LockLostError, not %v", context.Cause(held))
	return lost
}

func TestHandle_KeepAliveHearsOfItsLoss(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()

	t.Run("TakenOverElsewhereEndsTheHoldOnTheWakeup", func(t *testing.T) {
		w := newWatchingHolder(t)
		ok, err := w.other.Release(ctx, "A", plan) // as `agents locks release --owner A` would
		require.NoError(t, err)
		require.True(t, ok)
		taker, err := w.other.Take(ctx, "B", plan, application.AcquireOptions{})
		require.NoError(t, err)
		w.wake.wake()
		lost := ended(t, w.held)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		require.NotNil(t, lost.NewHolder)
		assert.Equal(t, taker.Lock().Token, lost.NewHolder.Token)
		assert.Equal(t, holdStart, w.clk.Now(), "learned without the clock moving")
		assert.EqualValues(t, 1, w.repo.reads.Load(), "one read, by the wake-up")
		assert.Equal(t, lost, w.h.Err())
	})

	t.Run("TheLossHeardIsAnEvent", func(t *testing.T) {
		events := make(eventChan, 64)
		w := newWatchingHolder(t, application.WithObserver(events))
		_, err := w.other.Release(ctx, "A", plan)
		require.NoError(t, err)
		w.wake.wake()
		lost := ended(t, w.held)
		for {
			select {
			case e := <-events:
				if e.Kind != application.EventLost {
					continue // the Take's
				}
				assert.Equal(t, "lost", e.Kind.String())
				assert.Equal(t, "A", e.Owner)
				assert.Equal(t, plan, e.Resource)
				require.NotNil(t, e.Previous, "the acquisition lost")
				assert.Equal(t, w.h.Lock().Token, e.Previous.Token)
				assert.Equal(t, lost, e.Err)
				return
			case <-time.After(eventBound):
				t.Fatal("a loss heard between renewals is no event: an operator's log would not show it")
			}
		}
	})

	t.Run("RemovedElsewhereSaysRemoved", func(t *testing.T) {
		w := newWatchingHolder(t)
		_, err := w.other.Release(ctx, "A", plan)
		require.NoError(t, err)
		w.wake.wake()
		assert.Equal(t, domain.LostRemoved, ended(t, w.held).Reason)
	})

	t.Run("WakeupOfAnotherResourceKeepsTheHold", func(t *testing.T) {
		w := newWatchingHolder(t)
		w.wake.wake()
		require.Eventually(t, func() bool { return w.repo.reads.Load() == 1 }, eventBound, time.Millisecond)
		assert.NoError(t, w.h.Err())
		assert.NoError(t, w.held.Err())
	})

	t.Run("StormReadsAFewTimesThenFourASecond", func(t *testing.T) {
		w := newWatchingHolder(t)
		for range 20 {
			w.wake.wake()
		}
		assert.Equal(t, 250*time.Millisecond, w.clk.NextTimer(t), "the look after the first three waits")
		assert.EqualValues(t, 3, w.repo.reads.Load(), "three reads at once, however many wake-ups")
		w.clk.Add(250 * time.Millisecond)
		require.Eventually(t, func() bool { return w.repo.reads.Load() == 4 }, eventBound, time.Millisecond)
		for range 20 {
			w.wake.wake()
		}
		assert.Equal(t, 250*time.Millisecond, w.clk.NextTimer(t))
		assert.EqualValues(t, 4, w.repo.reads.Load(), "no read before the pace allows")
		assert.NoError(t, w.held.Err())
	})

	t.Run("AReadThatHangsHoldsBackNoRenewal", func(t *testing.T) {
		w := newWatchingHolder(t)
		w.repo.hang.Store(true)
		w.wake.wake()
		require.Eventually(t, func() bool { return w.repo.reads.Load() == 1 }, eventBound, time.Millisecond)
		before := w.h.Lock().ExpiresAt
		w.clk.Add(30 * time.Second) // the renewal, while the look still waits for its read
		require.Eventually(t, func() bool { return w.h.Lock().ExpiresAt.After(before) }, eventBound, time.Millisecond,
			"the renewal waited for a read that does not answer: the lock would expire while its holder works on")
		assert.NoError(t, w.held.Err())
	})

	t.Run("OwnRenewalAndReleaseReadNothing", func(t *testing.T) {
		w := newWatchingHolder(t)
		w.clk.Add(30 * time.Second) // the renewal
		assert.Equal(t, 30*time.Second, w.clk.NextTimer(t), "the next renewal")
		watching := -1
		w.repo.release = func() { watching = w.wake.watching() }
		ok, err := w.h.Release(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, 0, watching, "the watch ends before the release is written")
		assert.Zero(t, w.repo.reads.Load(), "neither the renewal nor the release makes the holder read")
	})

	t.Run("RemovalByThisServiceEndsTheHoldAtOnce", func(t *testing.T) {
		for _, all := range []bool{false, true} {
			clk := testclock.New(holdStart)
			svc := newHoldService(t, memory.NewLockRepository(), clk) // no wake-ups at all
			h, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: time.Minute})
			require.NoError(t, err)
			held := h.KeepAlive(ctx)
			clk.NextTimer(t)
			if all {
				_, err = svc.ReleaseAllForOwner(ctx, "A")
			} else {
				_, err = svc.Release(ctx, "A", plan)
			}
			require.NoError(t, err)
			assert.Equal(t, domain.LostRemoved, ended(t, held).Reason)
			_, _ = h.Release(ctx)
		}
	})
}
