package application_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

var holdStart = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func newHoldService(t *testing.T, repo application.LockRepository, clk *testclock.Clock, opts ...application.Option) *application.LockService {
	t.Helper()
	svc, err := application.NewLockService(repo, clk, 0, opts...)
	require.NoError(t, err)
	return svc
}

type taken struct {
	owner string
	h     *application.Handle
	err   error
}

func takeAsync(svc *application.LockService, owner string, opts application.AcquireOptions, out chan<- taken) {
	go func() {
		h, err := svc.Take(context.Background(), owner, plan, opts)
		out <- taken{owner, h, err}
	}()
}

func TestLockService_TakeWaiting(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	wait := application.AcquireOptions{Wait: true, TTL: time.Minute}

	t.Run("FIFOInProcessWithoutPolling", func(t *testing.T) {
		clk := testclock.New(holdStart)
		svc := newHoldService(t, memory.NewLockRepository(), clk)
		holder, err := svc.Take(ctx, "A", plan, application.AcquireOptions{})
		require.NoError(t, err)

		out := make(chan taken, 3)
		for i, owner := range []string{"W1", "W2", "W3"} {
			takeAsync(svc, owner, wait, out)
			require.Eventually(t, func() bool { return svc.Waiting(plan) == i+1 }, 10*time.Second, time.Millisecond)
		}
		clk.NextTimer(t) // W1, the head, polls; the clock never moves in this test

		var order []string
		prev := holder
		for range 3 {
			_, err := prev.Release(ctx)
			require.NoError(t, err)
			got := <-out
			require.NoError(t, got.err)
			order = append(order, got.owner)
			prev = got.h
		}
		_, err = prev.Release(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"W1", "W2", "W3"}, order, "waiters take the lock in arrival order")
		assert.Equal(t, holdStart, clk.Now(), "woken by the releases, not by time")
	})

	t.Run("AnotherProcessPolls", func(t *testing.T) {
		// Two services on one store stand for two processes: a release by
		// one is not announced to the other, whose waiter must poll.
		clk := testclock.New(holdStart)
		repo := memory.NewLockRepository()
		procA, procB := newHoldService(t, repo, clk), newHoldService(t, repo, clk)
		holder, err := procA.Take(ctx, "A", plan, application.AcquireOptions{})
		require.NoError(t, err)
		out := make(chan taken, 1)
		takeAsync(procB, "B", wait, out)
		first := clk.NextTimer(t)
		assert.LessOrEqual(t, first, 5*time.Millisecond, "the first poll comes soon")
		_, err = holder.Release(ctx)
		require.NoError(t, err)
		clk.Add(first)
		got := <-out
		require.NoError(t, got.err)
		assert.Equal(t, "B", got.h.Lock().Owner)
	})

	t.Run("BackoffNeverSleepsPastTheExpiry", func(t *testing.T) {
		clk := testclock.New(holdStart)
		repo := memory.NewLockRepository()
		procA, procB := newHoldService(t, repo, clk), newHoldService(t, repo, clk)
		holder, err := procA.Take(ctx, "A", plan, application.AcquireOptions{TTL: 5 * time.Second})
		require.NoError(t, err)
		out := make(chan taken, 1)
		takeAsync(procB, "B", wait, out)
		var pauses []time.Duration
		for {
			select {
			case got := <-out:
				require.NoError(t, got.err)
				assert.Equal(t, holder.Lock().ExpiresAt, got.h.Lock().AcquiredAt,
					"taken at the holder's expiry, not later (pauses %v)", pauses)
				for i := 1; i < len(pauses)-1; i++ {
					assert.LessOrEqual(t, pauses[i], time.Second, "backoff is capped")
				}
				return
			case d := <-clk.Timers():
				pauses = append(pauses, d)
				clk.Add(d)
			case <-time.After(10 * time.Second):
				t.Fatalf("the waiter is stuck after pauses %v", pauses)
			}
		}
	})

	t.Run("TimeoutNamesTheHolder", func(t *testing.T) {
		clk := testclock.New(holdStart)
		svc := newHoldService(t, memory.NewLockRepository(), clk)
		holder, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		out := make(chan taken, 1)
		takeAsync(svc, "B", application.AcquireOptions{Wait: true, Timeout: 10 * time.Second}, out)
		for elapsed := time.Duration(0); elapsed < 10*time.Second; {
			d := clk.NextTimer(t)
			if d == 10*time.Second {
				continue // the timeout itself
			}
			d = min(d, 10*time.Second-elapsed)
			clk.Add(d)
			elapsed += d
		}
		got := <-out
		var conflict *domain.LockConflictError
		require.ErrorAs(t, got.err, &conflict)
		assert.Equal(t, holder.Lock(), conflict.Holder)
		assert.Equal(t, 10*time.Second, conflict.Waited)
		require.ErrorIs(t, got.err, context.DeadlineExceeded)
		assert.Contains(t, got.err.Error(), "after waiting 10s")
		assert.Zero(t, svc.Waiting(plan), "the waiter left the queue")
	})

	t.Run("ContextEndsTheWait", func(t *testing.T) {
		clk := testclock.New(holdStart)
		svc := newHoldService(t, memory.NewLockRepository(), clk)
		_, err := svc.Take(ctx, "A", plan, application.AcquireOptions{})
		require.NoError(t, err)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := svc.Take(cctx, "B", plan, wait); done <- err }()
		clk.NextTimer(t)
		cancel()
		err = <-done
		require.ErrorIs(t, err, domain.ErrConflict)
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("CloseEndsTheWait", func(t *testing.T) {
		clk := testclock.New(holdStart)
		svc := newHoldService(t, memory.NewLockRepository(), clk)
		_, err := svc.Take(ctx, "A", plan, application.AcquireOptions{})
		require.NoError(t, err)
		out := make(chan taken, 2)
		takeAsync(svc, "B", wait, out)
		takeAsync(svc, "C", wait, out)
		require.Eventually(t, func() bool { return svc.Waiting(plan) == 2 }, 10*time.Second, time.Millisecond)
		require.NoError(t, svc.Close(ctx))
		for range 2 {
			require.ErrorIs(t, (<-out).err, domain.ErrClosed)
		}
	})

	t.Run("BadTimeout", func(t *testing.T) {
		svc := newHoldService(t, memory.NewLockRepository(), testclock.New(holdStart))
		_, err := svc.Take(ctx, "A", plan, application.AcquireOptions{Wait: true, Timeout: -time.Second})
		require.ErrorIs(t, err, domain.ErrValidation)
	})
}

// flakyRepo is the memory store whose Updates fail with fail() while it
// returns an error.
type flakyRepo struct {
	*memory.LockRepository
	mu   sync.Mutex
	fail func(ctx context.Context) error
	// reads, held by a test, holds back every Get (a kept-alive handle's
	// look at its lock after a wake-up) until a change of several writes is whole.
	reads sync.RWMutex
}

func (r *flakyRepo) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	r.reads.RLock()
	defer r.reads.RUnlock()
	return r.LockRepository.Get(ctx, ref)
}

func (r *flakyRepo) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	r.mu.Lock()
	fail := r.fail
	r.mu.Unlock()
	if fail != nil {
		if err := fail(ctx); err != nil {
			return domain.Lock{}, err
		}
	}
	return r.LockRepository.Update(ctx, ref, decide)
}

func (r *flakyRepo) failWith(f func(context.Context) error) {
	r.mu.Lock()
	r.fail = f
	r.mu.Unlock()
}

func TestHandle_KeepAlive(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	busy := &domain.StoreError{Op: "renew", Kind: domain.StoreBusy}
	ttl := 10 * time.Second

	setup := func(t *testing.T) (*testclock.Clock, *flakyRepo, *application.LockService, *application.Handle, context.Context) {
		clk := testclock.New(holdStart)
		repo := &flakyRepo{LockRepository: memory.NewLockRepository()}
		svc := newHoldService(t, repo, clk)
		h, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: ttl})
		require.NoError(t, err)
		held := h.KeepAlive(ctx)
		t.Cleanup(func() { _, _ = h.Release(ctx) })
		return clk, repo, svc, h, held
	}

	t.Run("RenewsEveryHalfTTL", func(t *testing.T) {
		clk, _, _, h, held := setup(t)
		for i := 1; i <= 3; i++ {
			require.Equal(t, ttl/2, clk.NextTimer(t))
			clk.Add(ttl / 2)
			want := holdStart.Add(time.Duration(i)*ttl/2 + ttl)
			require.Eventually(t, func() bool { return h.Lock().ExpiresAt.Equal(want) }, 10*time.Second, time.Millisecond,
				"renewal %d", i)
		}
		require.NoError(t, held.Err())
		ok, err := h.Release(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
		<-h.Done()
		require.Error(t, held.Err(), "a released lock's context ends")
		assert.NoError(t, h.Err(), "a release is not a loss")
	})

	t.Run("TransientFailureIsRetriedNotLost", func(t *testing.T) {
		clk, repo, _, h, held := setup(t)
		// The keep-alive's goroutine counts the failures down while the
		// test reads them.
		var failures atomic.Int32
		failures.Store(3)
		repo.failWith(func(context.Context) error {
			if failures.Load() == 0 {
				return nil
			}
			failures.Add(-1)
			return busy
		})
		require.Equal(t, ttl/2, clk.NextTimer(t))
		clk.Add(ttl / 2)
		for failures.Load() > 0 || !h.Lock().ExpiresAt.After(holdStart.Add(ttl)) {
			select {
			case <-clk.Timers():
			case <-time.After(10 * time.Millisecond):
			}
			// To the next timer, if it is a retry's backoff, not the
			// guard at the expiry.
			if next := clk.PendingIn(); len(next) > 0 && next[0] < ttl/4 {
				clk.Add(next[0])
			}
		}
		assert.Less(t, clk.Now(), holdStart.Add(ttl), "renewed before the expiry")
		require.NoError(t, held.Err(), "transient failures before the expiry are not a loss")
		assert.NoError(t, h.Err())
	})

	t.Run("StoreFailingUntilTheExpiry", func(t *testing.T) {
		clk, repo, _, h, held := setup(t)
		repo.failWith(func(context.Context) error { return busy })
		require.Equal(t, ttl/2, clk.NextTimer(t))
		clk.Add(ttl / 2)
		for held.Err() == nil {
			select {
			case <-clk.Timers():
			case <-time.After(10 * time.Millisecond):
			}
			// To the next timer (a retry's backoff, clipped to the
			// expiry, or the guard at the expiry), never past the expiry.
			if next := clk.PendingIn(); len(next) > 0 && next[0] < ttl/4 {
				clk.Add(min(next[0], holdStart.Add(ttl).Sub(clk.Now())))
			}
		}
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(held), &lost)
		assert.Equal(t, domain.LostStoreFailing, lost.Reason)
		assert.Equal(t, holdStart.Add(ttl), lost.At, "lost at the expiry, not before, not after")
		require.ErrorIs(t, lost, domain.ErrUnavailable)
		require.ErrorIs(t, lost, domain.ErrExpired)
		require.ErrorIs(t, h.Err(), domain.ErrExpired)
	})

	// The timers that stop at the expiry land on it, not after it, when
	// the clock reads between two microseconds (the service rounds what
	// it decides on): a test that moves the clock exactly to the expiry
	// reaches the loss.
	t.Run("StoreFailingToAnExpiryBetweenMicroseconds", func(t *testing.T) {
		clk, repo, _, _, held := setup(t)
		repo.failWith(func(context.Context) error { return busy })
		expiry := holdStart.Add(ttl)
		require.Equal(t, ttl/2, clk.NextTimer(t))
		clk.Add(ttl / 2)
		clk.NextTimer(t) // the failed renewal's guard
		clk.NextTimer(t) // its backoff
		clk.Add(expiry.Add(-999 * time.Nanosecond).Sub(clk.Now()))
		clk.NextTimer(t) // the next renewal's guard
		clk.NextTimer(t) // its backoff, both clipped to the expiry
		clk.Add(expiry.Sub(clk.Now()))
		select {
		case <-held.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("not lost at the expiry; timers pending in %v", clk.PendingIn())
		}
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(held), &lost)
		assert.Equal(t, expiry, lost.At)
	})

	t.Run("TakenOver", func(t *testing.T) {
		clk, repo, svc, _, held := setup(t)
		// Someone releases A's lock behind its back (an operator), and B
		// takes the resource: the next renewal, or the look the release's
		// wake-up sets off, finds B. The look waits until B has it: one
		// between the two writes would rightly find the lock removed.
		repo.reads.Lock()
		_, err := svc.Release(ctx, "A", plan)
		require.NoError(t, err)
		b, err := svc.Acquire(ctx, "B", plan, time.Minute)
		repo.reads.Unlock()
		require.NoError(t, err)
		require.Equal(t, ttl/2, clk.NextTimer(t))
		clk.Add(ttl / 2)
		<-held.Done()
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(held), &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		assert.Equal(t, b, *lost.NewHolder)
		assert.Contains(t, lost.Error(), fmt.Sprintf("owner %q took it over (token %d)", "B", b.Token))
	})

	t.Run("RemovedBehindItsBack", func(t *testing.T) {
		clk, _, svc, _, held := setup(t)
		_, err := svc.Release(ctx, "A", plan)
		require.NoError(t, err)
		clk.NextTimer(t)
		clk.Add(ttl / 2)
		<-held.Done()
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(held), &lost)
		assert.Equal(t, domain.LostRemoved, lost.Reason)
		assert.Contains(t, lost.Error(), "removed from the store before its expiry")
	})

	t.Run("RenewalStuckPastTheExpiry", func(t *testing.T) {
		// The renewal hangs in the store (a stalled disk, a lost network):
		// the loss is reported at the expiry, not when the store answers.
		clk, repo, svc, _, held := setup(t)
		repo.failWith(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
		require.Equal(t, ttl/2, clk.NextTimer(t))
		clk.Add(ttl / 2)
		require.Equal(t, ttl/2, clk.NextTimer(t), "the guard at the expiry")
		clk.Add(ttl / 2)
		<-held.Done()
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(held), &lost)
		assert.Equal(t, domain.LostStoreFailing, lost.Reason)
		assert.Equal(t, holdStart.Add(ttl), lost.At)
		assert.Contains(t, lost.Error(), "had not completed when the lock expired")
		// A store that never answered is an unavailable store: the loss
		// matches both, and says so, with what to do.
		require.ErrorIs(t, lost, domain.ErrUnavailable)
		require.ErrorIs(t, lost, domain.ErrExpired)
		assert.Contains(t, lost.Error(), "the lock store could not be reached")
		assert.Contains(t, lost.Error(), "check that the database is reachable")
		repo.failWith(nil)
		_, err := svc.Acquire(ctx, "B", plan, 0)
		require.NoError(t, err, "the resource is free for another owner")
	})

	t.Run("CloseEndsIt", func(t *testing.T) {
		clk, _, svc, h, held := setup(t)
		clk.NextTimer(t)
		require.NoError(t, svc.Close(ctx))
		<-held.Done()
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(held), &lost)
		assert.Equal(t, domain.LostClosed, lost.Reason)
		<-h.Done()
	})
}

func TestLockService_Do(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()

	t.Run("RunsHoldingTheLockThenReleases", func(t *testing.T) {
		clk := testclock.New(holdStart)
		svc := newHoldService(t, memory.NewLockRepository(), clk)
		err := svc.Do(ctx, "A", plan, application.AcquireOptions{}, func(ctx context.Context, l domain.Lock) error {
			cur, err := svc.Get(ctx, plan)
			require.NoError(t, err)
			assert.Equal(t, l, cur)
			return nil
		})
		require.NoError(t, err)
		_, err = svc.Get(ctx, plan)
		require.ErrorIs(t, err, domain.ErrNotFound)
	})

	t.Run("ReleasesOnErrorAndPanic", func(t *testing.T) {
		svc := newHoldService(t, memory.NewLockRepository(), testclock.New(holdStart))
		mine := errors.New("the work failed")
		err := svc.Do(ctx, "A", plan, application.AcquireOptions{}, func(context.Context, domain.Lock) error { return mine })
		require.ErrorIs(t, err, mine)
		_, err = svc.Get(ctx, plan)
		require.ErrorIs(t, err, domain.ErrNotFound)

		require.PanicsWithValue(t, "boom", func() {
			_ = svc.Do(ctx, "A", plan, application.AcquireOptions{}, func(context.Context, domain.Lock) error { panic("boom") })
		})
		_, err = svc.Get(ctx, plan)
		require.ErrorIs(t, err, domain.ErrNotFound)
	})

	t.Run("LossEndsTheWorkAndIsReturned", func(t *testing.T) {
		clk := testclock.New(holdStart)
		svc := newHoldService(t, memory.NewLockRepository(), clk)
		var b domain.Lock
		err := svc.Do(ctx, "A", plan, application.AcquireOptions{TTL: 10 * time.Second}, func(ctx context.Context, l domain.Lock) error {
			_, err := svc.Release(ctx, "A", plan)
			require.NoError(t, err)
			b, err = svc.Acquire(ctx, "B", plan, time.Minute)
			require.NoError(t, err)
			clk.NextTimer(t)
			clk.Add(5 * time.Second)
			<-ctx.Done()
			return ctx.Err()
		})
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		require.ErrorIs(t, err, context.Canceled)
		cur, gerr := svc.Get(ctx, plan)
		require.NoError(t, gerr)
		assert.Equal(t, b, cur, "the new holder's lock is untouched")
	})

	t.Run("ConflictWithoutWaiting", func(t *testing.T) {
		svc := newHoldService(t, memory.NewLockRepository(), testclock.New(holdStart))
		_, err := svc.Acquire(ctx, "B", plan, 0)
		require.NoError(t, err)
		ran := false
		err = svc.Do(ctx, "A", plan, application.AcquireOptions{}, func(context.Context, domain.Lock) error { ran = true; return nil })
		require.ErrorIs(t, err, domain.ErrConflict)
		assert.False(t, ran)
	})
}

func TestHandle_KeepAlive_PausedPastItsExpiry(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	clk := testclock.New(holdStart)
	svc, err := application.NewLockService(memory.NewLockRepository(), clk, 0)
	require.NoError(t, err)
	h, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: 10 * time.Second})
	require.NoError(t, err)
	held := h.KeepAlive(ctx)
	defer h.Release(ctx)

	require.Equal(t, 5*time.Second, clk.NextTimer(t), "the renewal's wait")
	// The process slept through its renewal: when it wakes, the clock
	// reads 12s (Add holds Now until it has moved all the way).
	clk.Add(12 * time.Second)
	<-held.Done()
	var lost *domain.LockLostError
	require.ErrorAs(t, context.Cause(held), &lost)
	assert.Equal(t, domain.LostExpired, lost.Reason)
	assert.Equal(t, holdStart.Add(12*time.Second), lost.At)
	assert.Contains(t, lost.Error(), "expired at 2026-11-30T10:00:10Z without being renewed")
}

func TestHandle_Lost(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(holdStart)
	svc := newHoldService(t, memory.NewLockRepository(), clk)
	h, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: 10 * time.Second})
	require.NoError(t, err)
	require.NoError(t, h.Lost(ctx), "held")

	// No keep-alive ran: the loss is found in the store.
	clk.Set(holdStart.Add(10 * time.Second))
	var lost *domain.LockLostError
	require.ErrorAs(t, h.Lost(ctx), &lost)
	assert.Equal(t, domain.LostExpired, lost.Reason)

	b, err := svc.Acquire(ctx, "B", plan, time.Minute)
	require.NoError(t, err)
	require.ErrorAs(t, h.Lost(ctx), &lost)
	assert.Equal(t, domain.LostTakenOver, lost.Reason)
	assert.Equal(t, b, *lost.NewHolder)
}
