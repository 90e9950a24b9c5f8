package application_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// lateRenewals writes every Update, once armed, and then reports it as
// written after the lock's expiry: a store whose commit outlived the TTL,
// so the renewal committed but is of no use to the holder.
type lateRenewals struct {
	*memory.LockRepository
	mu    sync.Mutex
	armed bool
}

func (r *lateRenewals) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	l, err := r.LockRepository.Update(ctx, ref, decide)
	r.mu.Lock()
	armed := r.armed
	r.mu.Unlock()
	if err != nil || !armed {
		return l, err
	}
	return domain.Lock{}, &domain.LockExpiredError{Owner: l.Owner, Resource: ref, WrittenAt: l.ExpiresAt}
}

// takeA returns a service on repo, with a mock clock, and a handle of
// owner A on sharePlan for a minute.
func takeA(t *testing.T, repo application.LockRepository) (*application.LockService, *application.Handle) {
	t.Helper()
	svc, err := application.NewLockService(repo, shareMock(), 0)
	require.NoError(t, err)
	h, err := svc.Take(context.Background(), "A", sharePlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	return svc, h
}

// Do never reports success it could not confirm: a lock taken over while
// fn ran, in a service that closed before Do could ask the store, is not
// known to have been held to the end.
func TestHandle_DoAfterCloseIsNotASuccess(t *testing.T) {
	repo := memory.NewLockRepository()
	mc := shareMock()
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	other, err := application.NewLockService(repo, mc, 0) // another process
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	err = svc.Do(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Minute}, func(context.Context, domain.Lock) error {
		// Behind A's back: an operator removes its lock and B takes it.
		_, err := other.ReleaseAllForOwner(context.Background(), "A")
		require.NoError(t, err)
		_, err = other.Acquire(context.Background(), "B", sharePlan, time.Minute)
		require.NoError(t, err)
		cancel()
		require.NoError(t, svc.Close(context.Background()))
		return nil
	})
	require.Error(t, err, "Do reported success for a lock that B holds")
	assert.ErrorIs(t, err, domain.ErrClosed)
}

// A re-entry never shares an acquisition that its holder already knows to
// be lost, even while the store still shows it.
func TestHandle_ReentryOfAKnownLoss(t *testing.T) {
	repo := &lateRenewals{LockRepository: memory.NewLockRepository()}
	svc, h := takeA(t, repo)
	ctx := context.Background()
	defer h.Release(ctx)
	held := h.KeepAlive(ctx)

	repo.mu.Lock()
	repo.armed = true
	repo.mu.Unlock()
	_, err := h.Renew(ctx)
	var lost *domain.LockLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, domain.LostStoreFailing, lost.Reason)

	inner, err := svc.Take(held, "A", sharePlan, application.AcquireOptions{Reentrant: true})
	if err == nil {
		_, _ = inner.Release(ctx)
	}
	require.ErrorAs(t, err, &lost, "a re-entry shared a lock its holder knows is lost")
	assert.Equal(t, domain.LostStoreFailing, lost.Reason)
}

// The owner-scoped AcquireWait waits for a handle of its service, as Wait
// promises, rather than re-entering its lock by owner.
func TestHandle_AcquireWaitWaitsForAHandle(t *testing.T) {
	svc, h := takeA(t, memory.NewLockRepository())
	ctx := context.Background()

	got := make(chan error, 1)
	var l domain.Lock
	go func() {
		var err error
		l, err = svc.AcquireWait(ctx, "A", sharePlan, application.AcquireOptions{Wait: true, TTL: time.Minute})
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("AcquireWait returned (%v, token %d) while the handle of token %d holds the lock", err, l.Token, h.Lock().Token)
	case <-time.After(100 * time.Millisecond):
	}
	ok, err := h.Release(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, <-got)
	assert.Greater(t, l.Token, h.Lock().Token, "a new acquisition, after the handle's release")
}

// What ends a handle's keep-alive context says what happened: the loss a
// release found, or a release that failed, never "released" for either.
func TestHandle_ReleaseEndsTheContextWithTheTruth(t *testing.T) {
	t.Run("Loss", func(t *testing.T) {
		repo := memory.NewLockRepository()
		svc, h := takeA(t, repo)
		ctx := context.Background()
		held := h.KeepAlive(ctx)
		_, err := svc.ReleaseAllForOwner(ctx, "A") // behind the handle's back
		require.NoError(t, err)

		ok, err := h.Release(ctx)
		require.False(t, ok)
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		require.Error(t, held.Err())
		assert.ErrorAs(t, context.Cause(held), &lost, "the context ended with %v", context.Cause(held))
	})
	t.Run("Failure", func(t *testing.T) {
		repo := &failingDeleteToken{LockRepository: memory.NewLockRepository()}
		_, h := takeA(t, repo)
		ctx := context.Background()
		held := h.KeepAlive(ctx)
		repo.mu.Lock()
		repo.fails = 1
		repo.mu.Unlock()

		ok, err := h.Release(ctx)
		require.False(t, ok)
		var failed *domain.StoreError
		require.ErrorAs(t, err, &failed)
		require.Error(t, held.Err(), "the keep-alive has stopped: its context must end")
		cause := context.Cause(held)
		assert.ErrorAs(t, cause, &failed, "the context ended with %v", cause)
		assert.NotContains(t, cause.Error(), "was released")

		ok, err = h.Release(ctx)
		require.NoError(t, err)
		assert.True(t, ok, "the retry removes the lock")
	})
}

// A confirmed release is never turned into a loss afterwards: the handle
// gave the lock up, nobody took it from it.
func TestHandle_ReleasedIsNotLost(t *testing.T) {
	_, h := takeA(t, memory.NewLockRepository())
	ctx := context.Background()
	held := h.KeepAlive(ctx)
	ok, err := h.Release(ctx)
	require.NoError(t, err)
	require.True(t, ok)

	var lost *domain.LockLostError
	err = h.Lost(ctx)
	require.ErrorIs(t, err, domain.ErrExpired, "Lost after a release: not held")
	assert.False(t, errors.As(err, &lost), "Lost after a release reported a loss: %v", err)
	_, err = h.Renew(ctx)
	require.ErrorIs(t, err, domain.ErrExpired, "Renew after a release")
	assert.False(t, errors.As(err, &lost), "Renew after a release reported a loss: %v", err)
	assert.NoError(t, h.Err(), "Err after a release")
	assert.NotErrorAs(t, context.Cause(held), &lost)
}
