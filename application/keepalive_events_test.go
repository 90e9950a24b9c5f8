package application_test

import (
	"context"
	"sync"
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

// These keep-alive tests wait for events (a timer set, a renewal tried, the
// keep-alive ending), each with a generous bound, and fail with an
// assertion that names the broken promise the moment an event is wrong:
// a keep-alive that gives up on a transient error, or waits the wrong
// interval, fails them at once instead of hanging until the test timeout.

// eventBound bounds every wait for an event; only a bug reaches it.
const eventBound = 10 * time.Second

// attemptRepo is the memory store that reports every write the
// keep-alive tries, at the time of the service's clock, and fails the
// first failures of them.
type attemptRepo struct {
	*memory.LockRepository
	clk      *testclock.Clock
	attempts chan time.Time

	mu       sync.Mutex
	failures int // the writes still to fail; negative: every write fails
	err      error
}

func (r *attemptRepo) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	r.mu.Lock()
	fail := r.failures != 0
	if r.failures > 0 {
		r.failures--
	}
	r.mu.Unlock()
	r.attempts <- r.clk.Now().Truncate(application.Precision) // the service's instant
	if fail {
		return domain.Lock{}, r.err
	}
	return r.LockRepository.Update(ctx, ref, decide)
}

func (r *attemptRepo) fail(n int, err error) {
	r.mu.Lock()
	r.failures, r.err = n, err
	r.mu.Unlock()
}

type keptAlive struct {
	clk  *testclock.Clock
	repo *attemptRepo
	h    *application.Handle
	held context.Context
	ttl  time.Duration
}

func newKeptAlive(t *testing.T) *keptAlive {
	t.Helper()
	clk := testclock.New(holdStart)
	repo := &attemptRepo{LockRepository: memory.NewLockRepository(), clk: clk, attempts: make(chan time.Time, 1024)}
	svc := newHoldService(t, repo, clk)
	k := &keptAlive{clk: clk, repo: repo, ttl: 10 * time.Second}
	var err error
	k.h, err = svc.Take(context.Background(), "A", plan, application.AcquireOptions{TTL: k.ttl})
	require.NoError(t, err)
	<-repo.attempts // the Take's own write
	k.held = k.h.KeepAlive(context.Background())
	t.Cleanup(func() { _, _ = k.h.Release(context.Background()) })
	return k
}

// renewalTimer waits for the keep-alive's first timer, which must be the
// renewal interval, TTL/2, and fires it.
func (k *keptAlive) renewalTimer(t *testing.T) {
	t.Helper()
	select {
	case d := <-k.clk.Timers():
		require.Equal(t, k.ttl/2, d, "the keep-alive must renew every TTL/2")
		k.clk.Add(d)
	case <-time.After(eventBound):
		t.Fatalf("the keep-alive set no renewal timer within %s", eventBound)
	}
}

// attempt waits for the keep-alive's next write and returns its time.
func (k *keptAlive) attempt(t *testing.T, what string) time.Time {
	t.Helper()
	select {
	case at := <-k.repo.attempts:
		return at
	case <-k.h.Done():
		t.Fatalf("the keep-alive ended instead of %s: %v", what, k.h.Err())
	case <-time.After(eventBound):
		t.Fatalf("the keep-alive did not try %s within %s", what, eventBound)
	}
	return time.Time{}
}

// retryPause waits for the pause the keep-alive sets after a failed write
// at at, checks it and fires it. Each write also sets a guard timer at the
// lock's expiry (expiry - at), possibly late: guards counts the guards
// not yet seen, by duration.
func (k *keptAlive) retryPause(t *testing.T, at time.Time, guards map[time.Duration]int) time.Duration {
	t.Helper()
	expiry := k.h.Lock().ExpiresAt
	guards[expiry.Sub(k.clk.Now())]++ // timers count from the clock as it reads, not rounded
	for {
		select {
		case d := <-k.clk.Timers():
			if guards[d] > 0 {
				// A guard, or a pause clipped to the expiry that equals
				// this write's guard: then the guard comes next, and is
				// taken for the pause, which has the same length.
				guards[d]--
				continue
			}
			left := expiry.Sub(k.clk.Now())
			switch {
			case d > left:
				t.Fatalf("after a failed renewal at %s, the keep-alive waits %s, past the lock's expiry %s away", at, d, left)
			case d < left && (d < 25*time.Millisecond || d > 2*time.Second):
				t.Fatalf("after a failed renewal at %s, the keep-alive waits %s; its backoff is 50 ms doubling to 2 s, jittered by half", at, d)
			}
			k.clk.Add(d)
			return d
		case <-k.h.Done():
			t.Fatalf("the keep-alive gave up after a transient failure at %s, with the lock %s from its expiry: %v",
				at, expiry.Sub(k.clk.Now()), k.h.Err())
		case <-time.After(eventBound):
			t.Fatalf("the keep-alive set no retry within %s of the failed renewal at %s", eventBound, at)
		}
	}
}

func TestHandle_KeepAliveEvents(t *testing.T) {
	defer goleak.VerifyNone(t)
	busy := &domain.StoreError{Op: "renew", Kind: domain.StoreBusy}

	t.Run("RenewsEveryHalfTTL", func(t *testing.T) {
		k := newKeptAlive(t)
		k.renewalTimer(t)
		for i := 1; i <= 3; i++ {
			at := k.attempt(t, "a renewal once the interval passed")
			assert.Equal(t, holdStart.Add(time.Duration(i)*k.ttl/2), at, "renewal %d", i)
			// The renewal sets its guard at the old expiry, TTL/2 away,
			// and then the next renewal timer: both TTL/2.
			for range 2 {
				select {
				case d := <-k.clk.Timers():
					require.Equal(t, k.ttl/2, d, "after renewal %d, a timer other than TTL/2", i)
				case <-k.h.Done():
					t.Fatalf("renewal %d ended the keep-alive: %v", i, k.h.Err())
				case <-time.After(eventBound):
					t.Fatalf("after renewal %d, the keep-alive set no next renewal within %s", i, eventBound)
				}
			}
			assert.Equal(t, at.Add(k.ttl), k.h.Lock().ExpiresAt, "renewal %d extends to now+TTL", i)
			k.clk.Add(k.ttl / 2)
		}
		require.NoError(t, k.held.Err())
	})

	t.Run("TransientFailuresAreRetriedNotLost", func(t *testing.T) {
		k := newKeptAlive(t)
		k.repo.fail(3, busy)
		expiry := k.h.Lock().ExpiresAt
		k.renewalTimer(t)
		guards := map[time.Duration]int{}
		for i := 1; i <= 3; i++ {
			at := k.attempt(t, "a renewal")
			k.retryPause(t, at, guards)
		}
		at := k.attempt(t, "the renewal after three transient failures")
		require.Less(t, at, expiry, "retried before the expiry")
		deadline := time.After(eventBound)
		for !k.h.Lock().ExpiresAt.After(expiry) {
			select {
			case <-k.h.Done():
				t.Fatalf("the keep-alive ended after its retry succeeded: %v", k.h.Err())
			case <-deadline:
				t.Fatalf("the renewal at %s succeeded in the store, but the handle still expires at %s", at, k.h.Lock().ExpiresAt)
			case <-time.After(time.Millisecond):
			}
		}
		assert.Equal(t, at.Add(k.ttl), k.h.Lock().ExpiresAt)
		require.NoError(t, k.held.Err(), "transient failures before the expiry are not a loss")
		require.NoError(t, k.h.Err())
	})

	t.Run("StoreFailingUntilTheExpiry", func(t *testing.T) {
		k := newKeptAlive(t)
		k.repo.fail(-1, busy)
		expiry := k.h.Lock().ExpiresAt
		k.renewalTimer(t)
		guards := map[time.Duration]int{}
		retries := 0
		for done := false; !done; {
			at := k.attempt(t, "a renewal")
			require.Less(t, at, expiry, "no renewal is tried at or after the expiry")
			if retries++; retries > 200 {
				t.Fatalf("%d retries in %s: the backoff does not grow", retries, at.Sub(holdStart))
			}
			k.retryPause(t, at, guards)
			if !k.clk.Now().Before(expiry) {
				done = true
			}
		}
		select {
		case <-k.h.Done():
		case <-time.After(eventBound):
			t.Fatalf("the keep-alive did not end at the lock's expiry (now %s)", k.clk.Now())
		}
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(k.held), &lost)
		assert.Equal(t, domain.LostStoreFailing, lost.Reason)
		assert.Equal(t, expiry, lost.At, "lost at the expiry, not before, not after")
		require.ErrorIs(t, lost, domain.ErrUnavailable)
		t.Logf("%d retries before the expiry", retries)
	})
}
