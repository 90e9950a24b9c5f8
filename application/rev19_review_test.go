package application_test

// Adversarial review (rev19). These tests are expected to FAIL: each one
// shows a promise of the handle change that does not hold.

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
)

var rvPlan = domain.ResourceRef{Type: domain.ResourcePlan, ID: "rev19"}

var rvStart = time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)

func rvMock() *clock.Mock {
	mc := clock.NewMock()
	mc.Set(rvStart)
	return mc
}

// Docs (holding.md, Re-entry; AcquireOptions.Reentrant): a re-entered
// handle "shares the holder's token, does not change its expiry". But a
// re-entered handle renews (Renew, or its own KeepAlive, or a nested Do)
// with ITS OWN TTL, and so shortens the outer lock in the store. The outer
// handle still believes it holds the lock until its own, later expiry:
// another process takes the lock, and the outer keep-alive context stays
// live (two holders until the outer's next renewal, ttl/2 later), and the
// loss, once found, is explained falsely ("before its expiry ... removed").
func TestReview19_ReentrantRenewShortensOuterLock(t *testing.T) {
	ctx := context.Background()
	mc := rvMock()
	repo := memory.NewLockRepository()
	procA, err := application.NewLockService(repo, mc, 0) // "process" A
	require.NoError(t, err)
	procB, err := application.NewLockService(repo, mc, 0) // "process" B, same store
	require.NoError(t, err)

	outer, err := procA.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	held := outer.KeepAlive(ctx)
	defer outer.Release(ctx)

	inner, err := procA.Take(held, "A", rvPlan, application.AcquireOptions{TTL: 5 * time.Second, Reentrant: true})
	require.NoError(t, err)
	require.Equal(t, outer.Lock().Token, inner.Lock().Token)
	_, err = inner.Renew(ctx) // a helper that renews the handle it was given
	require.NoError(t, err)
	_, _ = inner.Release(ctx)

	cur, err := procA.Get(ctx, rvPlan)
	require.NoError(t, err)
	assert.Equal(t, outer.Lock().ExpiresAt, cur.ExpiresAt,
		"the re-entry changed the outer lock's expiry in the store (docs: it does not)")

	mc.Add(10 * time.Second) // far before the outer's renewal (30 min)
	other, err := procB.Take(ctx, "B", rvPlan, application.AcquireOptions{})
	if err == nil {
		defer other.Release(ctx)
		select {
		case <-held.Done():
		default:
			t.Errorf("process B holds %s (token %d) while A's keep-alive context is still live and A.Err()=%v",
				rvPlan, other.Lock().Token, outer.Err())
		}
		lost := outer.Lost(ctx)
		if lost != nil {
			t.Logf("outer's loss as explained: %v", lost)
			assert.NotContains(t, lost.Error(), "before its expiry",
				"the loss message says the lock was removed before its expiry; it expired (shortened by the re-entry)")
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

// Promise 1/3: a second Take never shares the token of another
// acquisition. A release that fails with a transient store error vacates
// the handle's slot anyway while the lock stays in the store: the next
// Take of the same owner re-enters it in the store and gets the first
// handle's token. The released handle then still reports "not lost"
// (Lost = nil), can still Renew, and its fence is the new handle's fence.
// The failed Release cannot be retried either: the second call is a
// no-op (false, nil) and the lock is left behind.
func TestReview19_FailedReleaseLetsNextTakeShareToken(t *testing.T) {
	ctx := context.Background()
	mc := rvMock()
	repo := &failingDeleteToken{LockRepository: memory.NewLockRepository()}
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)

	first, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	repo.fails = 1
	ok, err := first.Release(ctx)
	require.Error(t, err, "the store failed the release")
	require.False(t, ok)

	// A retry of the release: "harmless", and does nothing.
	ok, err = first.Release(ctx)
	t.Logf("second Release: %v, %v", ok, err)
	if l, gerr := svc.Get(ctx, rvPlan); gerr == nil && !l.ExpiredAt(svc.Now()) {
		t.Logf("after two Release calls the lock (token %d) is still stored, active until %s", l.Token, l.ExpiresAt)
	}

	second, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	defer second.Release(ctx)
	assert.NotEqual(t, first.Lock().Token, second.Lock().Token,
		"a new Take got the token of another (released) acquisition: two handles, one token, one fence")
	assert.Error(t, first.Lost(ctx), "the released first handle says its lock is not lost while the second handle holds it")
	_, rerr := first.Renew(ctx)
	assert.Error(t, rerr, "the released first handle renewed the second handle's lock")
}

// Promise 3 (mixing): a Take is "one acquisition, with its own token"
// (Take's godoc). An owner-scoped Acquire of the same owner held by
// another goroutine is an acquisition too, but Take re-enters it in the
// store: the handle gets that lock's token, and the owner-scoped holder's
// Release removes the handle's lock behind its back.
func TestReview19_TakeReentersOwnerScopedLock(t *testing.T) {
	ctx := context.Background()
	mc := rvMock()
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
	require.NoError(t, err)

	l, err := svc.Acquire(ctx, "A", rvPlan, time.Minute) // goroutine 1, owner-scoped
	require.NoError(t, err)
	h, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Minute}) // goroutine 2
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

// timerMock reports the timers the service sets, so that the test moves
// time only once the service waits.
type timerMock struct {
	*clock.Mock
	set chan time.Duration
}

func (c *timerMock) After(d time.Duration) <-chan time.Time {
	ch := c.Mock.After(d)
	c.set <- d
	return ch
}

func (c *timerMock) await(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.set:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no timer set")
		return 0
	}
}

// Promise 3 (FIFO): waiters of one service take the lock in arrival order.
// A waiter queued behind the head whose Timeout passes makes "one try" and
// takes a lock that has just come free, ahead of the head that has waited
// longer.
func TestReview19_TimedOutWaiterJumpsTheQueue(t *testing.T) {
	ctx := context.Background()
	mc := &timerMock{Mock: rvMock(), set: make(chan time.Duration, 1024)}
	repo := memory.NewLockRepository()
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	other, err := application.NewLockService(repo, mc, 0) // another process
	require.NoError(t, err)

	_, err = other.Acquire(ctx, "X", rvPlan, time.Minute)
	require.NoError(t, err)

	type res struct {
		h   *application.Handle
		err error
	}
	first := make(chan res, 1)
	go func() {
		h, err := svc.Take(ctx, "first", rvPlan, application.AcquireOptions{Wait: true, TTL: time.Minute})
		first <- res{h, err}
	}()
	poll := mc.await(t) // the head's poll backoff (2.5-5 ms)
	require.Less(t, poll, 10*time.Millisecond)

	second := make(chan res, 1)
	go func() {
		h, err := svc.Take(ctx, "second", rvPlan, application.AcquireOptions{Wait: true, TTL: time.Minute, Timeout: time.Millisecond})
		second <- res{h, err}
	}()
	require.Equal(t, time.Millisecond, mc.await(t)) // second's timeout timer
	require.Eventually(t, func() bool { return svc.Waiting(rvPlan) == 2 }, 5*time.Second, time.Millisecond)

	_, err = other.Release(ctx, "X", rvPlan) // the other process lets go
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

// Promise 6 / holding.md: "Container.Close ends every wait and keep-alive
// of the container at once ... it returns only once every keep-alive
// context it ended has ended". A keep-alive whose renewal is in the store
// is not ended by Close: Close waits for the renewal, which is bounded only
// by the lock's expiry (up to the TTL, an hour), so Close times out and
// the keep-alive's context is still live (the container then releases
// nothing).
func TestReview19_CloseDoesNotEndAKeepAliveInARenewal(t *testing.T) {
	ctx := context.Background()
	mc := &timerMock{Mock: rvMock(), set: make(chan time.Duration, 1024)}
	repo := &hangingRenewal{LockRepository: memory.NewLockRepository(), entered: make(chan struct{}, 1)}
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	h, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	held := h.KeepAlive(ctx)
	require.Equal(t, 30*time.Minute, mc.await(t))
	repo.mu.Lock()
	repo.armed = true
	repo.mu.Unlock()
	mc.Add(30 * time.Minute)
	<-repo.entered // the renewal is in the store
	mc.await(t)    // and its expiry guard is set

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

// KeepAlive: "returns a context ... that ends the moment the lock is
// lost". A handle that learns of the loss other than through its keep-alive
// goroutine (its own Renew, or a re-entrant Take inside Do's fn that finds
// the lock gone) records it (Err is set, its slot is free, another handle
// takes the plan), but the work's context stays live until the keep-alive's
// next renewal, ttl/2 later: the work goes on while another handle of the
// same process holds the plan.
func TestReview19_LossLearnedOutsideKeepAliveLeavesContextLive(t *testing.T) {
	ctx := context.Background()
	mc := rvMock()
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
	require.NoError(t, err)

	t.Run("Renew", func(t *testing.T) {
		h, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		held := h.KeepAlive(ctx)
		defer h.Release(ctx)
		_, err = svc.Release(ctx, "A", rvPlan) // behind its back
		require.NoError(t, err)
		_, err = h.Renew(ctx)
		require.ErrorIs(t, err, domain.ErrExpired)
		require.Error(t, h.Err(), "the handle knows it lost the lock")
		other, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err, "its slot is free: another handle takes the plan")
		defer other.Release(ctx)
		select {
		case <-held.Done():
		default:
			t.Errorf("the first handle's keep-alive context is live (Err=%v) while handle token %d holds the plan", h.Err(), other.Lock().Token)
		}
	})

	t.Run("ReentrantTakeInDo", func(t *testing.T) {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "rev19-do"}
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

// Promise 4 / KeepAlive: "context.Cause(lockCtx) is the
// *domain.LockLostError; h.Err() returns it too", and Do returns every
// loss. When the service closes between Do's Take and its KeepAlive, fn
// runs with a context already ended by a LostClosed loss, but h.Err() is
// nil and Do returns nil: the loss is dropped (the release's ErrClosed is
// swallowed).
func TestReview19_DoDropsLossWhenClosedBeforeKeepAlive(t *testing.T) {
	ctx := context.Background()
	mc := rvMock()
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
	require.NoError(t, err)
	svc.SetObserver(closeOnAcquire{svc})
	var cause error
	err = svc.Do(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Minute}, func(ctx context.Context, _ domain.Lock) error {
		cause = context.Cause(ctx)
		return nil
	})
	t.Logf("fn's context cause: %v", cause)
	var lost *domain.LockLostError
	require.ErrorAs(t, cause, &lost, "fn ran with its context ended by a loss")
	assert.Error(t, err, "Do returned nil although fn's lock was lost (service closed) before it ran")
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

// Promise 1/3, second trigger: a keep-alive that declares its lock lost
// (store failing) while the store still holds its token, active, frees its
// slot: the next Take of the same owner re-enters that token. The old
// handle (lost, as it says) and the new one share one token, so the old
// handle's fence passes while the new one holds the plan.
func TestReview19_LostByStoreFailingWhileRowActiveSharesToken(t *testing.T) {
	ctx := context.Background()
	mc := &timerMock{Mock: rvMock(), set: make(chan time.Duration, 1024)}
	repo := &committedThenCancelled{LockRepository: memory.NewLockRepository(), entered: make(chan struct{}, 1)}
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	first, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	first.KeepAlive(ctx)
	require.Equal(t, 30*time.Minute, mc.await(t))
	repo.mu.Lock()
	repo.armed = true
	repo.mu.Unlock()
	mc.Add(30 * time.Minute)
	<-repo.entered
	mc.await(t) // the renewal's expiry guard
	mc.Add(30 * time.Minute)
	<-first.Done()
	require.Error(t, first.Err())
	t.Logf("first: %v", first.Err())
	if cur, err := svc.Get(ctx, rvPlan); err == nil {
		t.Logf("store: token %d, expires %s, now %s", cur.Token, cur.ExpiresAt, svc.Now())
	}
	// The store still holds token 1, active: a Take refuses it rather
	// than share it, whoever's it is.
	_, err = svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict, "a Take of a lock the store holds for another acquisition is refused")
	assert.True(t, conflict.SameOwner)
	assert.Equal(t, first.Lock().Token, conflict.Holder.Token)
	mc.Add(30 * time.Minute) // the late renewal's expiry
	second, err := svc.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	defer second.Release(ctx)
	assert.NotEqual(t, first.Lock().Token, second.Lock().Token,
		"the new handle shares the token of the handle that declared it lost: its fence is the stale handle's fence")
	_, _ = first.Release(ctx)
}

// The same through the documented path, with no explicit Renew: a nested
// Do (Reentrant, the default TTL of a helper that is shorter than the
// outer's) keeps the shared lock alive with its own TTL, and leaves it
// with that short expiry when it returns. Another process then takes the
// plan while the outer Do's context is live.
func TestReview19_NestedDoShortensOuterLock(t *testing.T) {
	ctx := context.Background()
	mc := &timerMock{Mock: rvMock(), set: make(chan time.Duration, 1024)}
	repo := memory.NewLockRepository()
	procA, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	procB, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)

	outer, err := procA.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	held := outer.KeepAlive(ctx)
	defer outer.Release(ctx)
	require.Equal(t, 30*time.Minute, mc.await(t))

	err = procA.Do(held, "A", rvPlan, application.AcquireOptions{Reentrant: true, TTL: 10 * time.Second},
		func(ctx context.Context, _ domain.Lock) error {
			// The nested keep-alive renews nothing (no timer of its own):
			// the outer's keeps the lock.
			mc.Add(5 * time.Second)
			cur, err := procA.Get(ctx, rvPlan)
			require.NoError(t, err)
			assert.Equal(t, outer.Lock().ExpiresAt, cur.ExpiresAt, "the nested Do moved the outer lock's expiry")
			select {
			case d := <-mc.set:
				t.Errorf("the nested keep-alive set a timer of %s", d)
			default:
			}
			return ctx.Err()
		})
	require.NoError(t, err)
	cur, err := procA.Get(ctx, rvPlan)
	require.NoError(t, err)
	t.Logf("after the nested Do: the store's lock expires %s; the outer handle believes %s", cur.ExpiresAt, outer.Lock().ExpiresAt)

	mc.Add(20 * time.Second)
	other, err := procB.Take(ctx, "B", rvPlan, application.AcquireOptions{})
	if err == nil {
		defer other.Release(ctx)
		select {
		case <-held.Done():
		default:
			t.Errorf("process B took %s (token %d) 25s after the outer Do (TTL 1h) began; the outer's context is live", rvPlan, other.Lock().Token)
		}
	}
}

// Promise 5: no "after it expired at T" with T in the future. After the
// clock steps back (an NTP correction of a clock that ran ahead, under
// which another process took the expired lock), a renewal's loss says
// the lock was taken "after it expired at T" with T still ahead of the
// loss's own At.
func TestReview19_LossMessageAfterClockStepsBack(t *testing.T) {
	ctx := context.Background()
	mc := rvMock()
	repo := memory.NewLockRepository()
	procA, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	procB, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	h, err := procA.Take(ctx, "A", rvPlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	mc.Add(2 * time.Minute) // the clock runs ahead
	other, err := procB.Take(ctx, "B", rvPlan, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err)
	defer other.Release(ctx)
	mc.Set(rvStart.Add(30 * time.Second)) // and is stepped back
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
