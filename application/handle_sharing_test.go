package application_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

var sharePlan = domain.ResourceRef{Type: domain.ResourcePlan, ID: "share"}

var shareStart = time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)

func shareMock() *clock.Mock {
	mc := clock.NewMock()
	mc.Set(shareStart)
	return mc
}

// A re-entered handle (AcquireOptions.Reentrant) renews with a TTL of its
// own, shorter than the outer's: its Renew checks the shared acquisition
// and moves nothing, so another process cannot take the lock while the
// outer handle's keep-alive context is live.
func TestHandle_ReentrantRenewNeverMovesTheExpiry(t *testing.T) {
	ctx := context.Background()
	mc := shareMock()
	repo := memory.NewLockRepository()
	procA, err := application.NewLockService(repo, mc, 0) // "process" A
	require.NoError(t, err)
	procB, err := application.NewLockService(repo, mc, 0) // "process" B, same store
	require.NoError(t, err)

	outer, err := procA.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	held := outer.KeepAlive(ctx)
	defer outer.Release(ctx)

	inner, err := procA.Take(held, "A", sharePlan, application.AcquireOptions{TTL: 5 * time.Second, Reentrant: true})
	require.NoError(t, err)
	require.Equal(t, outer.Lock().Token, inner.Lock().Token)
	_, err = inner.Renew(ctx) // a helper that renews the handle it was given
	require.NoError(t, err)
	_, _ = inner.Release(ctx)

	cur, err := procA.Get(ctx, sharePlan)
	require.NoError(t, err)
	assert.Equal(t, outer.Lock().ExpiresAt, cur.ExpiresAt,
		"the re-entry changed the outer lock's expiry in the store (docs: it does not)")

	mc.Add(10 * time.Second) // far before the outer's renewal (30 min)
	other, err := procB.Take(ctx, "B", sharePlan, application.AcquireOptions{})
	if err == nil {
		defer other.Release(ctx)
		select {
		case <-held.Done():
		default:
			t.Errorf("process B holds %s (token %d) while A's keep-alive context is still live and A.Err()=%v",
				sharePlan, other.Lock().Token, outer.Err())
		}
		lost := outer.Lost(ctx)
		if lost != nil {
			t.Logf("outer's loss as explained: %v", lost)
			assert.NotContains(t, lost.Error(), "before its expiry",
				"the loss message says the lock was removed before its expiry; it expired (shortened by the re-entry)")
		}
	}
}

// The same through a nested Do (Reentrant, a helper's shorter TTL): its
// keep-alive renews nothing, sets no timer, and leaves the outer lock's
// expiry as the outer handle's keep-alive keeps it.
func TestHandle_NestedDoNeverShortensTheOuterLock(t *testing.T) {
	ctx := context.Background()
	mc := testclock.New(shareStart)
	repo := memory.NewLockRepository()
	procA, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	procB, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)

	outer, err := procA.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	held := outer.KeepAlive(ctx)
	defer outer.Release(ctx)
	require.Equal(t, 30*time.Minute, mc.NextTimer(t))

	err = procA.Do(held, "A", sharePlan, application.AcquireOptions{Reentrant: true, TTL: 10 * time.Second},
		func(ctx context.Context, _ domain.Lock) error {
			mc.Add(5 * time.Second) // the nested TTL's renewal interval
			return ctx.Err()
		})
	require.NoError(t, err)
	// The nested keep-alive renews nothing, so it set no timer of its
	// own (Do's release has waited for it): the outer's keeps the lock.
	for len(mc.Timers()) > 0 {
		if d := <-mc.Timers(); d == 5*time.Second {
			t.Errorf("the nested keep-alive set a renewal timer of %s", d)
		}
	}
	cur, err := procA.Get(ctx, sharePlan)
	require.NoError(t, err)
	t.Logf("after the nested Do: the store's lock expires %s; the outer handle believes %s", cur.ExpiresAt, outer.Lock().ExpiresAt)

	mc.Add(20 * time.Second)
	other, err := procB.Take(ctx, "B", sharePlan, application.AcquireOptions{})
	if err == nil {
		defer other.Release(ctx)
		select {
		case <-held.Done():
		default:
			t.Errorf("process B took %s (token %d) 25s after the outer Do (TTL 1h) began; the outer's context is live", sharePlan, other.Lock().Token)
		}
	}
}

// failingDeleteToken fails the first DeleteToken with a transient store
// error (SQLite busy, PostgreSQL unreachable for a moment).
type failingDeleteToken struct {
	*memory.LockRepository
	mu    sync.Mutex
	fails int
}

func (r *failingDeleteToken) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	r.mu.Lock()
	fail := r.fails > 0
	if fail {
		r.fails--
	}
	r.mu.Unlock()
	if fail {
		return false, &domain.StoreError{Op: "release", Kind: domain.StoreBusy, Err: errors.New("database is locked")}
	}
	return r.LockRepository.DeleteToken(ctx, ref, token, now)
}

// A release that the store fails leaves the handle unreleased: the retry
// removes the lock, and the next Take of the same owner gets a new token,
// so the first handle reads its loss and cannot renew the second's lock.
func TestHandle_FailedReleaseStaysRetryable(t *testing.T) {
	ctx := context.Background()
	mc := shareMock()
	repo := &failingDeleteToken{LockRepository: memory.NewLockRepository()}
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)

	first, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	repo.fails = 1
	ok, err := first.Release(ctx)
	require.Error(t, err, "the store failed the release")
	require.False(t, ok)

	// A retry of the release: "harmless", and does nothing.
	ok, err = first.Release(ctx)
	t.Logf("second Release: %v, %v", ok, err)
	if l, gerr := svc.Get(ctx, sharePlan); gerr == nil && !l.ExpiredAt(svc.Now()) {
		t.Logf("after two Release calls the lock (token %d) is still stored, active until %s", l.Token, l.ExpiresAt)
	}

	second, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	defer second.Release(ctx)
	assert.NotEqual(t, first.Lock().Token, second.Lock().Token,
		"a new Take got the token of another (released) acquisition: two handles, one token, one fence")
	assert.Error(t, first.Lost(ctx), "the released first handle says its lock is not lost while the second handle holds it")
	_, rerr := first.Renew(ctx)
	assert.Error(t, rerr, "the released first handle renewed the second handle's lock")
}

// deletedThenFailed removes the lock on a DeleteToken, once armed, and
// then reports a failure: a release whose DELETE committed but whose
// answer never came back (the connection cut after the commit).
type deletedThenFailed struct {
	*memory.LockRepository
	mu    sync.Mutex
	armed bool
}

func (r *deletedThenFailed) arm() {
	r.mu.Lock()
	r.armed = true
	r.mu.Unlock()
}

func (r *deletedThenFailed) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	ok, err := r.LockRepository.DeleteToken(ctx, ref, token, now)
	r.mu.Lock()
	armed := r.armed
	r.armed = false
	r.mu.Unlock()
	if armed && ok && err == nil {
		return false, &domain.StoreError{Op: "release lock on " + ref.String(), Kind: domain.StoreUnreachable,
			Err: errors.New("connection reset after the commit")}
	}
	return ok, err
}

// A release that fails after the store removed the row leaves the handle
// its place in the service, as Release promises: no other handle of the
// service takes the resource, although the store has no lock on it,
// until the handle's expiry as it knew it, or a retry of the release.
func TestHandle_FailedReleaseKeepsItsPlace(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*clock.Mock, *application.LockService, *application.Handle) {
		t.Helper()
		mc := shareMock()
		repo := &deletedThenFailed{LockRepository: memory.NewLockRepository()}
		svc, err := application.NewLockService(repo, mc, 0)
		require.NoError(t, err)
		first, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		repo.arm()
		ok, err := first.Release(ctx)
		require.ErrorIs(t, err, domain.ErrUnavailable, "the store failed the release")
		require.False(t, ok)
		_, err = svc.Get(ctx, sharePlan)
		require.ErrorIs(t, err, domain.ErrNotFound, "the failed release had removed the row")
		return mc, svc, first
	}
	refused := func(t *testing.T, svc *application.LockService, first *application.Handle) {
		t.Helper()
		for _, owner := range []string{"B", "A"} {
			second, err := svc.Take(ctx, owner, sharePlan, application.AcquireOptions{TTL: time.Minute})
			if err == nil {
				_, _ = second.Release(ctx)
				t.Fatalf("owner %s took %s (token %d) in the process whose handle (token %d) still holds its place "+
					"after a release that failed: two handles of one service held at once", owner, sharePlan, second.Lock().Token, first.Lock().Token)
			}
			var conflict *domain.LockConflictError
			require.ErrorAs(t, err, &conflict, "owner %s", owner)
			assert.True(t, conflict.InProcess, "owner %s: refused by the handle of this process", owner)
			assert.Equal(t, first.Lock().Token, conflict.Holder.Token, "owner %s: the holder named is the first handle", owner)
		}
	}

	t.Run("UntilItsExpiry", func(t *testing.T) {
		mc, svc, first := setup(t)
		refused(t, svc, first)
		mc.Add(time.Minute - time.Microsecond)
		refused(t, svc, first)
		mc.Add(time.Microsecond) // the first handle's expiry: its place is gone
		second, err := svc.Take(ctx, "B", sharePlan, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err, "at the first handle's expiry the resource is free")
		assert.Greater(t, second.Lock().Token, first.Lock().Token)
		_, err = second.Release(ctx)
		require.NoError(t, err)
	})
	t.Run("UntilTheRetry", func(t *testing.T) {
		_, svc, first := setup(t)
		refused(t, svc, first)
		ok, err := first.Release(ctx)
		require.NoError(t, err, "the retry finds no lock: the failed attempt removed it")
		assert.False(t, ok)
		second, err := svc.Take(ctx, "B", sharePlan, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err, "once the release is retried the resource is free")
		_, err = second.Release(ctx)
		require.NoError(t, err)
	})
}

// An owner-scoped Acquire is another acquisition, even of the same owner:
// a Take never re-enters it in the store (DecideTake) and is refused with
// SameOwner set, naming it.
func TestHandle_TakeRefusesTheOwnersOtherAcquisition(t *testing.T) {
	ctx := context.Background()
	mc := shareMock()
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
	require.NoError(t, err)

	l, err := svc.Acquire(ctx, "A", sharePlan, time.Minute) // goroutine 1, owner-scoped
	require.NoError(t, err)
	h, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Minute}) // goroutine 2
	if err == nil {
		defer h.Release(ctx)
		assert.NotEqual(t, l.Token, h.Lock().Token,
			"Take returned a handle on the token of goroutine 1's owner-scoped lock: two holders in one process")
	}
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict)
	assert.True(t, conflict.SameOwner)
	assert.False(t, conflict.InProcess)
	assert.Equal(t, l, conflict.Holder)
	assert.Contains(t, err.Error(), "another acquisition of owner")
}

// committedThenCancelled commits every Update, once armed, but reports a
// failure once its context ends: a renewal whose COMMIT reached the store
// while the caller's context was cancelled (the driver returns the
// context's error).
type committedThenCancelled struct {
	*memory.LockRepository
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
}

func (r *committedThenCancelled) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	l, err := r.LockRepository.Update(ctx, ref, decide)
	r.mu.Lock()
	armed := r.armed
	r.armed = false
	r.mu.Unlock()
	if armed && err == nil {
		r.entered <- struct{}{}
		<-ctx.Done()
		return domain.Lock{}, &domain.StoreError{Op: "renew", Kind: domain.StoreUnreachable, Err: ctx.Err()}
	}
	return l, err
}

// A keep-alive that declares its lock lost (store failing) although its
// renewal committed leaves its token active in the store: the next Take
// of the same owner is refused rather than share that token, and gets a
// token of its own once the row has expired.
func TestHandle_LossDeclaredWhileTheRowLivesIsNeverShared(t *testing.T) {
	ctx := context.Background()
	mc := testclock.New(shareStart)
	repo := &committedThenCancelled{LockRepository: memory.NewLockRepository(), entered: make(chan struct{}, 1)}
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	first, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	first.KeepAlive(ctx)
	require.Equal(t, 30*time.Minute, mc.NextTimer(t))
	repo.mu.Lock()
	repo.armed = true
	repo.mu.Unlock()
	mc.Add(30 * time.Minute)
	<-repo.entered
	mc.NextTimer(t) // the renewal's expiry guard
	mc.Add(30 * time.Minute)
	<-first.Done()
	require.Error(t, first.Err())
	t.Logf("first: %v", first.Err())
	if cur, err := svc.Get(ctx, sharePlan); err == nil {
		t.Logf("store: token %d, expires %s, now %s", cur.Token, cur.ExpiresAt, svc.Now())
	}
	// The store still holds token 1, active: a Take refuses it rather
	// than share it, whoever's it is.
	_, err = svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict, "a Take of a lock the store holds for another acquisition is refused")
	assert.True(t, conflict.SameOwner)
	assert.Equal(t, first.Lock().Token, conflict.Holder.Token)
	mc.Add(30 * time.Minute) // the late renewal's expiry
	second, err := svc.Take(ctx, "A", sharePlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	defer second.Release(ctx)
	assert.NotEqual(t, first.Lock().Token, second.Lock().Token,
		"the new handle shares the token of the handle that declared it lost: its fence is the stale handle's fence")
	_, _ = first.Release(ctx)
}
