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

// afterDelete runs a function of the test's, once, right after a
// DeleteToken that removed the lock: between the release's write and
// the moment the handle records it.
type afterDelete struct {
	*memory.LockRepository
	mu   sync.Mutex
	then func()
}

func (r *afterDelete) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	ok, err := r.LockRepository.DeleteToken(ctx, ref, token, now)
	r.mu.Lock()
	f := r.then
	r.then = nil
	r.mu.Unlock()
	if ok && f != nil {
		f()
	}
	return ok, err
}

// A release that removed the lock is the handle's own, whatever another
// goroutine of the holder reads from the store in the meantime.
func TestHandle_ReleaseRacesAConcurrentCheck(t *testing.T) {
	for _, op := range []string{"Lost", "Renew", "ReentrantTake"} {
		t.Run(op, func(t *testing.T) {
			ctx := context.Background()
			repo := &afterDelete{LockRepository: memory.NewLockRepository()}
			svc := newSvc(t, repo)
			h, err := svc.Take(ctx, "a", sharePlan, application.AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			held := h.KeepAlive(ctx)
			repo.then = func() {
				var wg sync.WaitGroup
				wg.Add(1)
				go func() { // another goroutine of the holder's process
					defer wg.Done()
					switch op {
					case "Lost":
						t.Logf("concurrent Lost: %v", h.Lost(ctx))
					case "Renew":
						_, err := h.Renew(ctx)
						t.Logf("concurrent Renew: %v", err)
					case "ReentrantTake":
						_, err := svc.Take(held, "a", sharePlan, application.AcquireOptions{Reentrant: true})
						t.Logf("concurrent re-entrant Take: %v", err)
					}
				}()
				wg.Wait()
			}
			ok, err := h.Release(ctx)
			t.Logf("Release = %v, %v", ok, err)
			if !ok || err != nil {
				t.Skip("release did not report success")
			}
			if e := h.Err(); e != nil {
				t.Errorf("after Release (true,nil), Err() = %v; want nil", e)
			}
			if c := context.Cause(held); c == nil || errors.As(c, new(*domain.LockLostError)) {
				t.Errorf("after Release (true,nil), keep-alive cause = %v; want 'the lock was released'", c)
			}
			var lost *domain.LockLostError
			if err := h.Lost(ctx); errors.As(err, &lost) || !errors.Is(err, domain.ErrExpired) {
				t.Errorf("after Release (true,nil), Lost() = %v; want ErrExpired, not a loss", err)
			}
		})
	}
}

// unreadable fails every Get once armed: a store that cannot be read.
type unreadable struct {
	*memory.LockRepository
	mu      sync.Mutex
	failGet bool
}

func (r *unreadable) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	r.mu.Lock()
	f := r.failGet
	r.mu.Unlock()
	if f {
		return domain.Lock{}, &domain.StoreError{Op: "get", Err: errors.New("store unreachable")}
	}
	return r.LockRepository.Get(ctx, ref)
}

// A nested re-entrant Do reports success only when the store confirmed the
// shared lock after its fn: a lock removed meanwhile, then a store that
// cannot be read, or a service closed, is no success.
func TestHandle_NestedDoUnconfirmedOnUnreadableStore(t *testing.T) {
	ctx := context.Background()
	repo := &unreadable{LockRepository: memory.NewLockRepository()}
	clk := shareMock()
	a, b := newSvcClock(t, repo, clk), newSvcClock(t, repo, clk)
	var inner error = errors.New("inner Do not run")
	outer := a.Do(ctx, "a", sharePlan, application.AcquireOptions{}, func(octx context.Context, l domain.Lock) error {
		inner = a.Do(octx, "a", sharePlan, application.AcquireOptions{Reentrant: true}, func(ictx context.Context, l domain.Lock) error {
			if n, err := b.ReleaseAllForOwner(ctx, "a"); n != 1 || err != nil {
				t.Fatalf("ReleaseAllForOwner = %d, %v", n, err)
			}
			repo.mu.Lock()
			repo.failGet = true
			repo.mu.Unlock()
			return nil
		})
		return nil
	})
	t.Logf("outer Do = %v", outer)
	if inner == nil {
		t.Errorf("nested re-entrant Do returned nil although the lock was removed while its fn ran and the store confirmed nothing")
	}
}

func TestHandle_NestedDoUnconfirmedAfterCancelAndClose(t *testing.T) {
	repo := memory.NewLockRepository()
	clk := shareMock()
	a, b := newSvcClock(t, repo, clk), newSvcClock(t, repo, clk)
	ctx, cancel := context.WithCancel(context.Background())
	var inner error = errors.New("inner Do not run")
	outer := a.Do(ctx, "a", sharePlan, application.AcquireOptions{}, func(octx context.Context, l domain.Lock) error {
		inner = a.Do(octx, "a", sharePlan, application.AcquireOptions{Reentrant: true}, func(ictx context.Context, l domain.Lock) error {
			b.ReleaseAllForOwner(context.Background(), "a") // removed behind its back
			cancel()
			<-ictx.Done()
			if err := a.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			return nil
		})
		return nil
	})
	t.Logf("outer Do = %v", outer)
	if inner == nil {
		t.Errorf("nested re-entrant Do returned nil after Close, with the lock removed while its fn ran")
	}
}

func newSvc(t *testing.T, repo application.LockRepository) *application.LockService {
	t.Helper()
	return newSvcClock(t, repo, shareMock())
}

func newSvcClock(t *testing.T, repo application.LockRepository, clk application.Clock) *application.LockService {
	t.Helper()
	svc, err := application.NewLockService(repo, clk, 0)
	require.NoError(t, err)
	return svc
}

// flakyReads fails the next fails Gets, runs during (once) inside the
// next DeleteToken, before it writes, and makes the next commitThenFail
// DeleteTokens fail after they removed the lock: a commit whose answer was
// lost.
type flakyReads struct {
	*memory.LockRepository
	mu             sync.Mutex
	fails          int
	during         func()
	commitThenFail int
}

func (r *flakyReads) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	r.mu.Lock()
	fail := r.fails > 0
	if fail {
		r.fails--
	}
	r.mu.Unlock()
	if fail {
		return domain.Lock{}, &domain.StoreError{Op: "get", Kind: domain.StoreBusy, Err: errors.New("database is locked")}
	}
	return r.LockRepository.Get(ctx, ref)
}

func (r *flakyReads) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	r.mu.Lock()
	during := r.during
	r.during = nil
	lose := r.commitThenFail > 0
	if lose {
		r.commitThenFail--
	}
	r.mu.Unlock()
	if during != nil {
		during()
	}
	ok, err := r.LockRepository.DeleteToken(ctx, ref, token, now)
	if lose && err == nil {
		return false, &domain.StoreError{Op: "release", Kind: domain.StoreUnreachable, Err: errors.New("connection reset after COMMIT")}
	}
	return ok, err
}

// takenByB has A's handle taken over by B, behind its back.
func takenByB(t *testing.T, repo application.LockRepository, svc *application.LockService) {
	t.Helper()
	other := newSvc(t, repo)
	_, err := other.ReleaseAllForOwner(context.Background(), "A")
	require.NoError(t, err)
	_, err = other.Acquire(context.Background(), "B", sharePlan, time.Minute)
	require.NoError(t, err)
}

// A release that removed nothing proves the lock is no longer the
// handle's, even when the store cannot say why: the loss is recorded,
// never turned into the handle's own release.
func TestHandle_ReleaseAfterTakeoverWithTheReadFailing(t *testing.T) {
	repo := &flakyReads{LockRepository: memory.NewLockRepository()}
	svc, h := takeA(t, repo)
	takenByB(t, repo, svc)
	repo.mu.Lock()
	repo.fails = 1
	repo.mu.Unlock()

	ok, err := h.Release(context.Background())
	require.False(t, ok)
	var lost *domain.LockLostError
	require.ErrorAs(t, err, &lost, "Release hid B's takeover: %v", err)
	require.ErrorAs(t, h.Err(), &lost)
	require.ErrorAs(t, h.Lost(context.Background()), &lost)
}

// A check made by another goroutine while the release is written waits
// for its outcome: a takeover before the release is a loss, never
// "released".
func TestHandle_CheckDuringReleaseAfterTakeover(t *testing.T) {
	repo := &flakyReads{LockRepository: memory.NewLockRepository()}
	svc, h := takeA(t, repo)
	takenByB(t, repo, svc)
	checked := make(chan error, 1)
	repo.mu.Lock()
	repo.during = func() {
		answered := make(chan struct{})
		go func() {
			err := h.Lost(context.Background())
			close(answered)
			checked <- err
		}()
		// Hold the release's write open while the check runs: long
		// enough for a check that does not wait to answer within it.
		select {
		case <-answered:
		case <-time.After(50 * time.Millisecond):
		}
	}
	repo.mu.Unlock()

	_, err := h.Release(context.Background())
	var lost *domain.LockLostError
	require.ErrorAs(t, err, &lost)
	require.ErrorAs(t, <-checked, &lost, "a check during the release")
	assert.Equal(t, domain.LostTakenOver, lost.Reason)
}

// A release whose first attempt removed the lock but failed to say so is
// retried: finding no lock then is no loss, since that attempt may have
// removed it; a lock of another's is.
func TestHandle_RetryAfterAnAnsweredLostCommit(t *testing.T) {
	repo := &flakyReads{LockRepository: memory.NewLockRepository(), commitThenFail: 1}
	_, h := takeA(t, repo)
	ctx := context.Background()
	ok, err := h.Release(ctx)
	require.False(t, ok)
	require.ErrorIs(t, err, domain.ErrUnavailable)

	ok, err = h.Release(ctx)
	require.NoError(t, err, "the retry found the lock gone, which its first attempt may have done")
	assert.False(t, ok, "the retry removed nothing itself")
	assert.NoError(t, h.Err())
}
