package application_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// Only the head of a service's queue tries the lock: a waiter behind it
// whose Timeout passes just after the lock comes free answers from a read
// and leaves the lock to the head.
func TestHandle_TimedOutWaiterNeverJumpsTheQueue(t *testing.T) {
	ctx := context.Background()
	mc := testclock.New(shareStart)
	repo := memory.NewLockRepository()
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	other, err := application.NewLockService(repo, mc, 0) // another process
	require.NoError(t, err)

	_, err = other.Acquire(ctx, "X", sharePlan, time.Minute)
	require.NoError(t, err)

	type res struct {
		h   *application.Handle
		err error
	}
	first := make(chan res, 1)
	go func() {
		h, err := svc.Take(ctx, "first", sharePlan, application.AcquireOptions{Wait: true, TTL: time.Minute})
		first <- res{h, err}
	}()
	poll := mc.NextTimer(t) // the head's poll backoff (2.5-5 ms)
	require.Less(t, poll, 10*time.Millisecond)

	second := make(chan res, 1)
	go func() {
		h, err := svc.Take(ctx, "second", sharePlan, application.AcquireOptions{Wait: true, TTL: time.Minute, Timeout: time.Millisecond})
		second <- res{h, err}
	}()
	require.Equal(t, time.Millisecond, mc.NextTimer(t)) // second's timeout timer
	require.Eventually(t, func() bool { return svc.Waiting(sharePlan) == 2 }, 5*time.Second, time.Millisecond)

	_, err = other.Release(ctx, "X", sharePlan) // the other process lets go
	require.NoError(t, err)
	mc.Add(time.Millisecond) // second's timeout; the head still sleeps
	r := <-second
	if r.err == nil {
		t.Errorf("the second waiter (timed out, queued behind the head) took the lock, token %d, ahead of the head", r.h.Lock().Token)
		_, _ = r.h.Release(ctx)
	}
	mc.Add(time.Second)
	f := <-first
	require.NoError(t, f.err)
	_, _ = f.h.Release(ctx)
}

// hangingRenewal blocks every Update, once armed, until its context ends:
// a renewal stuck in the store (a SQLite writer queue, a PostgreSQL server
// that stopped answering).
type hangingRenewal struct {
	*memory.LockRepository
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
}

func (r *hangingRenewal) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	r.mu.Lock()
	armed := r.armed
	r.mu.Unlock()
	if armed {
		r.entered <- struct{}{}
		<-ctx.Done()
		return domain.Lock{}, &domain.StoreError{Op: "renew", Kind: domain.StoreUnreachable, Err: ctx.Err()}
	}
	return r.LockRepository.Update(ctx, ref, decide)
}

// Close cancels a keep-alive's renewal that is inside the store (a writer
// queue, a server that stopped answering): it returns promptly, with the
// keep-alive's context ended.
func TestHandle_CloseEndsARenewalInTheStore(t *testing.T) {
	ctx := context.Background()
	mc := testclock.New(shareStart)
	repo := &hangingRenewal{LockRepository: memory.NewLockRepository(), entered: make(chan struct{}, 1)}
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	h, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	held := h.KeepAlive(ctx)
	require.Equal(t, 30*time.Minute, mc.NextTimer(t))
	repo.mu.Lock()
	repo.armed = true
	repo.mu.Unlock()
	mc.Add(30 * time.Minute)
	<-repo.entered  // the renewal is in the store
	mc.NextTimer(t) // and its expiry guard is set

	closeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cerr := svc.Close(closeCtx)
	assert.NoError(t, cerr, "Close did not end the keep-alive")
	select {
	case <-held.Done():
	default:
		t.Error("Close returned while the keep-alive context it should have ended is still live")
	}
	mc.Add(time.Hour) // let the renewal's expiry guard end it
	<-h.Done()
}

// A loss the handle learns other than through its keep-alive (its own
// Renew, a re-entrant Take inside Do's function) ends the keep-alive's
// context at once, before another handle can take the resource.
func TestHandle_LossLearnedAnywhereEndsTheContext(t *testing.T) {
	ctx := context.Background()
	mc := shareMock()
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
	require.NoError(t, err)

	t.Run("Renew", func(t *testing.T) {
		h, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		held := h.KeepAlive(ctx)
		defer h.Release(ctx)
		_, err = svc.Release(ctx, "A", sharePlan) // behind its back
		require.NoError(t, err)
		_, err = h.Renew(ctx)
		require.ErrorIs(t, err, domain.ErrExpired)
		require.Error(t, h.Err(), "the handle knows it lost the lock")
		other, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err, "its slot is free: another handle takes the plan")
		defer other.Release(ctx)
		select {
		case <-held.Done():
		default:
			t.Errorf("the first handle's keep-alive context is live (Err=%v) while handle token %d holds the plan", h.Err(), other.Lock().Token)
		}
	})

	t.Run("ReentrantTakeInDo", func(t *testing.T) {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "share-do"}
		var live bool
		var second *application.Handle
		err := svc.Do(ctx, "A", ref, application.AcquireOptions{TTL: time.Hour}, func(ctx context.Context, _ domain.Lock) error {
			_, err := svc.Release(context.Background(), "A", ref) // an operator, behind its back
			require.NoError(t, err)
			_, err = svc.Take(ctx, "A", ref, application.AcquireOptions{Reentrant: true})
			require.ErrorIs(t, err, domain.ErrExpired, "the nested Take finds the loss")
			second, err = svc.Take(context.Background(), "A", ref, application.AcquireOptions{TTL: time.Hour})
			require.NoError(t, err, "another goroutine's handle takes the plan")
			live = ctx.Err() == nil
			return nil
		})
		require.Error(t, err)
		if second != nil {
			defer second.Release(ctx)
		}
		assert.False(t, live, "fn's context was still live after the loss was recorded and another handle held the plan")
	})
}

// closeOnAcquire closes the service the moment a lock is acquired: a
// concurrent Close (the container shutting down) that lands between Do's
// Take and its KeepAlive.
type closeOnAcquire struct{ svc *application.LockService }

func (o closeOnAcquire) Observe(ctx context.Context, e application.Event) {
	if e.Kind == application.EventAcquired {
		_ = o.svc.Close(context.Background())
	}
}

// A Close that lands between Do's Take and its KeepAlive: the keep-alive
// records the loss (service closed), fn's context has ended with it, and
// Do returns it.
func TestHandle_DoReturnsTheLossOfACloseBeforeKeepAlive(t *testing.T) {
	ctx := context.Background()
	mc := shareMock()
	closer := &closeOnAcquire{}
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0, application.WithObserver(closer))
	require.NoError(t, err)
	closer.svc = svc
	var cause error
	err = svc.Do(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Minute}, func(ctx context.Context, _ domain.Lock) error {
		cause = context.Cause(ctx)
		return nil
	})
	t.Logf("fn's context cause: %v", cause)
	var lost *domain.LockLostError
	require.ErrorAs(t, cause, &lost, "fn ran with its context ended by a loss")
	assert.Error(t, err, "Do returned nil although fn's lock was lost (service closed) before it ran")
}

// After the clock steps back (under a clock that ran ahead, another
// process took the expired lock), the loss is noticed before the new
// lock's time: its message says the clocks disagree and claims neither
// that the lock had expired nor that it was taken before its expiry.
func TestHandle_LossAfterAClockStepBackClaimsNoOrder(t *testing.T) {
	ctx := context.Background()
	mc := shareMock()
	repo := memory.NewLockRepository()
	procA, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	procB, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	h, err := procA.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	mc.Add(2 * time.Minute) // the clock runs ahead
	other, err := procB.Take(ctx, "B", sharePlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	defer other.Release(ctx)
	mc.Set(shareStart.Add(30 * time.Second)) // and is stepped back
	_, err = h.Renew(ctx)
	var lost *domain.LockLostError
	require.ErrorAs(t, err, &lost)
	t.Logf("%v", lost)
	// The lock's expiry (07:01) and its taking (07:02, on the clock that
	// took it) are both after the loss was noticed (07:00:30): the message
	// must not claim the lock had expired, nor an order the clocks cannot
	// prove.
	require.True(t, lost.Lock.ExpiresAt.After(lost.At))
	assert.NotContains(t, lost.Error(), "after it expired", "the loss (noticed at %s) says the lock expired at %s, a time still to come", lost.At, lost.Lock.ExpiresAt)
	assert.NotContains(t, lost.Error(), "before its expiry")
	assert.Contains(t, lost.Error(), "the clocks disagree")
}
