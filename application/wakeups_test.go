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

// fakeWakeups stands for the wake-ups between processes: the test decides
// when a watcher hears of a release, and whether another process waits.
type fakeWakeups struct {
	mu        sync.Mutex
	watches   int
	active    int           // watches not stopped yet
	c         chan struct{} // handed to every watcher; nil: watching is not possible
	contended bool
	watched   chan domain.ResourceRef // receives on each Watch
}

func newFakeWakeups(watchable bool) *fakeWakeups {
	w := &fakeWakeups{watched: make(chan domain.ResourceRef, 16)}
	if watchable {
		w.c = make(chan struct{}, 1)
	}
	return w
}

func (w *fakeWakeups) Watch(ref domain.ResourceRef) (<-chan struct{}, func()) {
	w.mu.Lock()
	w.watches++
	w.active++
	w.mu.Unlock()
	w.watched <- ref
	var once sync.Once
	stop := func() {
		once.Do(func() {
			w.mu.Lock()
			w.active--
			w.mu.Unlock()
		})
	}
	if w.c == nil {
		return nil, stop
	}
	return w.c, stop
}

// watching returns how many watches have not been stopped.
func (w *fakeWakeups) watching() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.active
}

func (w *fakeWakeups) Contended(domain.ResourceRef) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.contended
}

// wake is what the adapter does when another process releases.
func (w *fakeWakeups) wake() { w.c <- struct{}{} }

// waitingBehind sets up two processes on one store: another process
// holding plan for ttl (its handle is no handle of the waiter's service)
// and a waiter B in a service with wakeups (watchable or not), started
// with opts. It returns once B has asked to watch plan.
type waitingBehind struct {
	clk    *testclock.Clock
	wake   *fakeWakeups
	holder *application.Handle
	out    chan taken // B's result
}

func startWaitingBehind(t *testing.T, watchable bool, ttl time.Duration, opts application.AcquireOptions) waitingBehind {
	t.Helper()
	w := waitingBehind{clk: testclock.New(holdStart), wake: newFakeWakeups(watchable), out: make(chan taken, 1)}
	repo := memory.NewLockRepository()
	var err error
	w.holder, err = newHoldService(t, repo, w.clk).Take(context.Background(), "A", plan, application.AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	svc := newHoldService(t, repo, w.clk, application.WithWakeups(w.wake))
	takeAsync(svc, "B", opts, w.out)
	require.Equal(t, plan, <-w.wake.watched)
	return w
}

func TestLockService_WaitWithWakeups(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	wait := application.AcquireOptions{Wait: true, TTL: time.Minute}

	t.Run("ReleaseElsewhereWakesWithoutTheClock", func(t *testing.T) {
		w := startWaitingBehind(t, true, time.Hour, wait)
		clk, wake, holder, out := w.clk, w.wake, w.holder, w.out
		d := clk.NextTimer(t) // asleep, with the fallback read set
		assert.LessOrEqual(t, d, time.Second, "the fallback read comes at most a second later")

		_, err := holder.Release(ctx)
		require.NoError(t, err)
		wake.wake()
		got := <-out // the clock never moved
		require.NoError(t, got.err)
		assert.Equal(t, "B", got.h.Lock().Owner)
		_, err = got.h.Release(ctx)
		require.NoError(t, err)
	})

	t.Run("LostWakeupHandsOverAtTheFallback", func(t *testing.T) {
		w := startWaitingBehind(t, true, time.Hour, wait)
		clk, holder, out := w.clk, w.holder, w.out
		d := clk.NextTimer(t)
		_, err := holder.Release(ctx) // and no wake-up ever comes
		require.NoError(t, err)
		select {
		case got := <-out:
			t.Fatalf("taken before the fallback read: %+v", got)
		default:
		}
		clk.Add(d)
		got := <-out
		require.NoError(t, got.err)
		assert.Equal(t, "B", got.h.Lock().Owner)
		_, err = got.h.Release(ctx)
		require.NoError(t, err)
	})

	t.Run("LostWakeupHandsOverAtTheHoldersExpiry", func(t *testing.T) {
		// The waiter's own TTL is short: it must not matter to the wait.
		w := startWaitingBehind(t, true, time.Minute, application.AcquireOptions{Wait: true, TTL: 10 * time.Second})
		clk, wake, holder, out := w.clk, w.wake, w.holder, w.out
		expires := holder.Lock().ExpiresAt
		reads := 0
		for {
			d := clk.NextTimer(t)
			// The service reads the time to the millisecond, as it stores it.
			require.False(t, clk.Now().Add(d).After(expires.Add(time.Millisecond)),
				"a pause ends past the holder's expiry: now %s, pause %s, expiry %s", clk.Now(), d, expires)
			reads++
			clk.Add(d)
			if !clk.Now().Before(expires) {
				break
			}
		}
		got := <-out
		require.NoError(t, got.err)
		assert.Equal(t, "B", got.h.Lock().Owner)
		assert.Greater(t, got.h.Lock().Token, holder.Lock().Token)
		// At most two reads a second while the holder lives: a minute.
		assert.LessOrEqual(t, reads, 2*60+1)
		assert.Equal(t, 1, wake.watches, "one watch for the whole wait")
		_, err := got.h.Release(ctx)
		require.NoError(t, err)
	})

	t.Run("UnwatchableResourcePollsWithBackoff", func(t *testing.T) {
		w := startWaitingBehind(t, false, time.Hour, wait)
		clk, wake, holder, out := w.clk, w.wake, w.holder, w.out
		first := clk.NextTimer(t)
		assert.LessOrEqual(t, first, 10*time.Millisecond, "without a watch the waiter polls from a short pause")
		clk.Add(first)
		next := clk.NextTimer(t)
		assert.Equal(t, 1, wake.watches, "a watch that is not possible is asked for once, not on every poll")
		_, err := holder.Release(ctx)
		require.NoError(t, err)
		clk.Add(next)
		for {
			select {
			case got := <-out:
				require.NoError(t, got.err)
				_, err = got.h.Release(ctx)
				require.NoError(t, err)
				return
			case d := <-clk.Timers():
				clk.Add(d)
			}
		}
	})

	t.Run("ReleaserLetsAWaitingProcessGoFirst", func(t *testing.T) {
		for _, contended := range []bool{false, true} {
			clk := testclock.New(holdStart)
			wake := newFakeWakeups(true)
			wake.contended = contended // another process waits for plan
			svc := newHoldService(t, memory.NewLockRepository(), clk, application.WithWakeups(wake))
			holder, err := svc.Take(ctx, "A", plan, application.AcquireOptions{})
			require.NoError(t, err)
			out := make(chan taken, 1)
			takeAsync(svc, "A2", wait, out)
			require.Eventually(t, func() bool { return svc.Waiting(plan) == 1 }, 10*time.Second, time.Millisecond)
			clk.NextTimer(t) // asleep behind a handle of its own service

			released := time.Now()
			_, err = holder.Release(ctx)
			require.NoError(t, err)
			// No move of the clock: the grace is real time, so that a
			// release hands over on a test clock too.
			got := <-out
			require.NoError(t, got.err)
			assert.Equal(t, "A2", got.h.Lock().Owner)
			if contended {
				assert.GreaterOrEqual(t, time.Since(released), 10*time.Millisecond,
					"the local waiter holds back for the grace, leaving the lock free for the other process")
			}
			_, err = got.h.Release(ctx)
			require.NoError(t, err)
		}
	})
}
