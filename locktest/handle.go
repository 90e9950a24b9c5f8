package locktest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// testHandles holds a store to what a Handle needs of it: writes by the
// acquisition's token, never by owner. The same owner's newer lock on the
// resource is another acquisition, and must survive a stale handle's
// renewal and release.
func testHandles(t *testing.T, newRepo NewRepository) {
	run(t, "DeleteToken", func(t *testing.T) {
		repo := newRepo(t)
		ctx := t.Context()
		own := mustStore(t, repo, &domain.Lock{Owner: "A", Resource: plan1, AcquiredAt: Start, ExpiresAt: Start.Add(time.Minute)})

		ok, err := repo.DeleteToken(ctx, plan1, own.Token+1000, Start)
		require.NoError(t, err)
		assert.False(t, ok, "another token removes nothing")
		ok, err = repo.DeleteToken(ctx, plan1, own.Token, own.ExpiresAt)
		require.NoError(t, err)
		assert.False(t, ok, "the token's lock, expired at now, is left alone")
		got, err := repo.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, *own, got, "nothing was written")

		ok, err = repo.DeleteToken(ctx, plan1, own.Token, own.ExpiresAt.Add(-time.Microsecond))
		require.NoError(t, err)
		assert.True(t, ok, "the token's active lock is removed")
		_, err = repo.Get(ctx, plan1)
		require.ErrorIs(t, err, domain.ErrNotFound)
		ok, err = repo.DeleteToken(ctx, plan1, own.Token, Start)
		require.NoError(t, err)
		assert.False(t, ok, "a lock removed is removed once")
	})

	run(t, "StaleHandleTouchesNothing", func(t *testing.T) {
		// A's handle; its lock removed behind its back; A acquires again
		// (a new token). The stale handle's renewal and release are
		// losses, and A's new lock is untouched.
		f := mustFixture(t, newRepo)
		h, err := f.Svc.Take(f.Ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		_, err = f.Svc.Release(f.Ctx, "A", plan1)
		require.NoError(t, err)
		again := f.MustAcquire(t, "A", plan1, time.Minute)
		f.Clock.Add(time.Second)

		_, err = h.Renew(f.Ctx)
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		assert.NotEqual(t, again.Token, h.Lock().Token, "the handle keeps its token")
		ok, err := h.Release(f.Ctx)
		assert.False(t, ok)
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, []domain.Lock{again}, f.All(t), "A's new lock is untouched")
	})
}
