package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
	"github.com/cleveragents/locks/tests/testdb"
)

// waitThenTravel is the embedder's time-travel test of the issue that the
// exported test clock answers: another owner holds the plan for 30s, the
// README's runPlan waits for it (Do with Wait), the test waits until the
// service says the waiter waits (Waiting == 1) and moves the clock 31s:
// the waiter must take the lock, with no other wait and no sleep. Before
// Waiting counted only a parked waiter, a move between the waiter's
// queueing and its timer was lost, and the run hung.
func waitThenTravel(t *testing.T, cfg locks.Config) {
	t.Helper()
	waitThenTravelBy(t, cfg, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), time.Minute, 31*time.Second)
}

// waitThenTravelBy is waitThenTravel from start, with the waiter's
// Timeout and the move given.
func waitThenTravelBy(t *testing.T, cfg locks.Config, start time.Time, timeout, move time.Duration) {
	t.Helper()
	ctx := context.Background()
	clk := testclock.New(start)
	cfg.Clock, cfg.Owner = clk, "me"
	c := MustOpen(t, cfg)
	_, err := c.Locks.Acquire(ctx, "other", plan1, 30*time.Second)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		done <- c.Locks.Do(ctx, c.Owner(), plan1, application.AcquireOptions{Wait: true, Timeout: timeout},
			func(context.Context, domain.Lock) error { return nil })
	}()
	for deadline := time.Now().Add(10 * time.Second); c.Locks.Waiting(plan1) != 1; {
		require.True(t, time.Now().Before(deadline), "the waiter never said it waits")
		runtime.Gosched() // look again at once: a test asks as soon as it can
	}
	clk.Add(move)
	select {
	case err := <-done:
		require.NoError(t, err, "the wait ends with the lock taken once the holder expired")
	case <-time.After(10 * time.Second):
		t.Fatalf("hung: the waiter did not see the clock move %s (timers pending: %v)", move, clk.PendingIn())
	}
}

func TestTimeTravel_WaitingThenMove(t *testing.T) {
	t.Run("memory", func(t *testing.T) { waitThenTravel(t, locks.Config{Database: locks.MemoryDatabase}) })
	t.Run("sqlite", func(t *testing.T) {
		waitThenTravel(t, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db")})
	})
	t.Run("postgres", func(t *testing.T) {
		if os.Getenv("LOCKS_TEST_POSTGRES_DSN") == "" {
			t.Skip("LOCKS_TEST_POSTGRES_DSN is not set")
		}
		waitThenTravel(t, locks.Config{Database: testdb.Postgres(t)})
	})
}

// A keep-alive (TTL 10s) renews at every interval the test moves the
// clock by, ten times over, while another goroutine sets timers on the
// same clock: each of those fires once, when due, and none of the moves
// hangs (clock.Mock could fire a timer set while Add ran twice, and then
// deadlock).
func TestTimeTravel_KeepAliveWhileOthersSetTimers(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clk := testclock.New(start)
	c := MustOpen(t, locks.Config{Database: locks.MemoryDatabase, Owner: "me", Clock: clk})
	const ttl, interval = 10 * time.Second, 5 * time.Second
	h, err := c.Locks.Take(ctx, "me", plan1, application.AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	held := h.KeepAlive(ctx)

	type noise struct {
		due time.Time
		c   <-chan time.Time
	}
	var timers []noise
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d := time.Duration(1+i%4999) * time.Millisecond // never the keep-alive's 5s
			before := clk.Now()
			c := clk.After(d)
			if clk.Now().Equal(before) { // else its due time is not known exactly
				timers = append(timers, noise{before.Add(d), c})
			}
			if i%64 == 0 {
				runtime.Gosched()
			}
		}
	}()
	// parked waits until the keep-alive has set n timers of an interval:
	// at a renewal, the guard at the expiry (set at half-life, it too is
	// an interval away), then the wait for the next renewal.
	parked := func(n int) {
		for n > 0 {
			if clk.NextTimer(t) == interval {
				n--
			}
		}
	}
	parked(1)
	for i := range 10 {
		clk.Add(interval)
		parked(2)
		require.Equal(t, start.Add(time.Duration(i+1)*interval+ttl), h.Lock().ExpiresAt, "renewal %d", i+1)
	}
	close(stop)
	<-stopped
	t.Logf("the other goroutine set %d timers whose due time is known while the clock moved", len(timers))
	require.NoError(t, held.Err(), "kept alive through ten intervals")
	now := clk.Now()
	for _, n := range timers {
		fired := 0
		for range 2 {
			select {
			case <-n.c:
				fired++
			default:
			}
		}
		want := 0
		if !n.due.After(now) {
			want = 1
		}
		require.Equal(t, want, fired, "a timer due %s, with the clock at %s", n.due, now)
	}
	_, err = h.Release(ctx)
	require.NoError(t, err)
}

// On PostgreSQL, a clock.Mock (not only the test clock) implies LocalTime:
// moved past another owner's expiry, it takes the lock, where the
// server's clock, which the test cannot move, refused it "in 30s".
func TestTimeTravel_PostgresMockClockNeedsNoLocalTime(t *testing.T) {
	ctx := context.Background()
	mc := newMock()
	c := MustOpen(t, locks.Config{Database: testdb.Postgres(t), Owner: "me", Clock: mc})
	_, err := c.Locks.Acquire(ctx, "other", plan1, 30*time.Second)
	require.NoError(t, err)
	mc.Add(31 * time.Second)
	l, err := c.Locks.Acquire(ctx, "me", plan1, time.Minute)
	require.NoError(t, err, "taken once the mock clock passed the holder's expiry")
	require.Equal(t, "me", l.Owner)
}

// timeTravelStores runs f on each store a time-travel test covers, with
// the number of rounds to run on it.
func timeTravelStores(t *testing.T, f func(t *testing.T, cfg locks.Config, rounds int)) {
	t.Run("memory", func(t *testing.T) { f(t, locks.Config{Database: locks.MemoryDatabase}, 300) })
	t.Run("sqlite", func(t *testing.T) {
		f(t, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db")}, 200)
	})
	t.Run("postgres", func(t *testing.T) {
		if os.Getenv("LOCKS_TEST_POSTGRES_DSN") == "" {
			t.Skip("LOCKS_TEST_POSTGRES_DSN is not set")
		}
		f(t, locks.Config{Database: testdb.Postgres(t)}, 200)
	})
}

// untilWaiting waits (in real time, with a generous bound that fails
// rather than hangs) until Waiting(ref) == n.
func untilWaiting(t *testing.T, c *locks.Container, ref domain.ResourceRef, n int, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); c.Locks.Waiting(ref) != n; {
		if !time.Now().Before(deadline) {
			t.Fatalf("%s: Waiting(%s) is %d, never %d", what, ref.ID, c.Locks.Waiting(ref), n)
		}
		runtime.Gosched()
	}
}

// A waiter queued behind another, whose timeout the clock moved past, is
// no longer parked: Waiting never counts it again, even while it reads
// the store for the holder its give-up names. (Waiting used to count it
// until it left the queue, as its timer's channel was already drained.)
func TestTimeTravel_TimedOutWaiterIsNotCounted(t *testing.T) {
	timeTravelStores(t, func(t *testing.T, cfg locks.Config, rounds int) {
		ctx := context.Background()
		clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
		cfg.Clock, cfg.Owner = clk, "me"
		c := MustOpen(t, cfg)
		counted := 0
		for i := range rounds {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("gaveup-%d-%d", i, time.Now().UnixNano())}
			_, err := c.Locks.Acquire(ctx, "other", ref, time.Hour)
			require.NoError(t, err)
			first, second := make(chan error, 1), make(chan error, 1)
			go func() {
				first <- c.Locks.Do(ctx, c.Owner(), ref, application.AcquireOptions{Wait: true},
					func(context.Context, domain.Lock) error { return nil })
			}()
			untilWaiting(t, c, ref, 1, "the first waiter")
			go func() {
				second <- c.Locks.Do(ctx, c.Owner(), ref, application.AcquireOptions{Wait: true, Timeout: 10 * time.Second},
					func(context.Context, domain.Lock) error { return nil })
			}()
			untilWaiting(t, c, ref, 2, "both waiters")
			clk.Add(10 * time.Second) // the second one's timeout
			most := 0
		watch:
			for deadline := time.Now().Add(10 * time.Second); ; {
				most = max(most, c.Locks.Waiting(ref))
				select {
				case err := <-second:
					require.ErrorIs(t, err, context.DeadlineExceeded)
					break watch
				default:
				}
				require.True(t, time.Now().Before(deadline), "round %d: the second waiter never gave up", i)
				runtime.Gosched()
			}
			if most > 1 {
				counted++
			}
			untilWaiting(t, c, ref, 1, "the first waiter, parked again")
			clk.Add(2 * time.Hour) // past the holder's expiry: the first one takes the lock
			select {
			case err := <-first:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: the first waiter hung (timers pending: %v)", i, clk.PendingIn())
			}
		}
		require.Zero(t, counted, "of %d rounds, Waiting counted the waiter that had timed out in %d", rounds, counted)
	})
}

// Of two waiters, the clock moves past one's timeout: the other looks at
// the store again (the one behind, if the head timed out, comes to the
// head in the wake of that move). Once Waiting says 1 again, moving the
// clock past the holder's expiry reaches the waiter left: it takes the
// lock, even if it came to the head, and read the clock, while that move
// ran.
func TestTimeTravel_WaitingAgainThenMove(t *testing.T) {
	t.Run("BehindTimesOut", func(t *testing.T) { timeTravelStores(t, oneTimesOutThenMove(false)) })
	t.Run("HeadTimesOut", func(t *testing.T) { timeTravelStores(t, oneTimesOutThenMove(true)) })
}

func oneTimesOutThenMove(headTimesOut bool) func(t *testing.T, cfg locks.Config, rounds int) {
	return func(t *testing.T, cfg locks.Config, rounds int) {
		ctx := context.Background()
		clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
		cfg.Clock, cfg.Owner = clk, "me"
		c := MustOpen(t, cfg)
		for i := range rounds {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("again-%d-%d", i, time.Now().UnixNano())}
			_, err := c.Locks.Acquire(ctx, "other", ref, 30*time.Second)
			require.NoError(t, err)
			gaveUp, stays := make(chan error, 1), make(chan error, 1)
			wait := func(out chan<- error, timeout time.Duration) {
				out <- c.Locks.Do(ctx, c.Owner(), ref, application.AcquireOptions{Wait: true, Timeout: timeout},
					func(context.Context, domain.Lock) error { return nil })
			}
			head, behind := stays, gaveUp
			headTimeout, behindTimeout := time.Duration(0), 10*time.Second
			if headTimesOut {
				head, behind = gaveUp, stays
				headTimeout, behindTimeout = behindTimeout, headTimeout
			}
			go wait(head, headTimeout)
			untilWaiting(t, c, ref, 1, "the first waiter")
			go wait(behind, behindTimeout)
			untilWaiting(t, c, ref, 2, "both waiters")
			clk.Add(10 * time.Second) // one times out; the other looks again
			untilWaiting(t, c, ref, 1, "the waiter left, parked again")
			clk.Add(25 * time.Second) // 5s past the holder's expiry
			select {
			case err := <-stays:
				require.NoError(t, err, "round %d", i)
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: hung; Waiting=%d, timers pending: %v", i, c.Locks.Waiting(ref), clk.PendingIn())
			}
			require.ErrorIs(t, <-gaveUp, context.DeadlineExceeded, "round %d", i)
		}
	}
}

// One move past both a waiter's timeout (10s) and the holder's expiry
// (30s) ends the wait as a timeout, as the same wait in real time would:
// the deadline came first, so the waiter never takes the lock that came
// free after it.
func TestTimeTravel_TimeoutBeforeExpiryInOneMove(t *testing.T) {
	timeTravelStores(t, func(t *testing.T, cfg locks.Config, rounds int) {
		ctx := context.Background()
		clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
		cfg.Clock, cfg.Owner = clk, "me"
		c := MustOpen(t, cfg)
		for i := range rounds {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("both-%d-%d", i, time.Now().UnixNano())}
			_, err := c.Locks.Acquire(ctx, "other", ref, 30*time.Second)
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				done <- c.Locks.Do(ctx, c.Owner(), ref, application.AcquireOptions{Wait: true, Timeout: 10 * time.Second},
					func(context.Context, domain.Lock) error { return nil })
			}()
			untilWaiting(t, c, ref, 1, "the waiter")
			clk.Add(35 * time.Second)
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.DeadlineExceeded, "round %d: the timeout came before the expiry", i)
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: hung; timers pending: %v", i, clk.PendingIn())
			}
		}
	})
}

// Two containers on one database share a test clock: a holds a handle, and
// a waiter of b and then one of a are parked. a releases. A release hands
// the lock over without any move of the clock: both waits end, one after
// the other, although b's process waits and a keeps its own waiter back
// for a moment to let b go first.
func TestTimeTravel_ReleaseHandsOverAcrossProcessesWithoutAMove(t *testing.T) {
	run := func(t *testing.T, db string, rounds int) {
		ctx := context.Background()
		clk := testclock.New(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
		a := MustOpen(t, locks.Config{Database: db, Owner: "a", Clock: clk})
		b := MustOpen(t, locks.Config{Database: db, Owner: "b", Clock: clk})
		for i := range rounds {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("handover-%d-%d", i, time.Now().UnixNano())}
			h, err := a.Locks.Take(ctx, "a", ref, application.AcquireOptions{TTL: time.Hour})
			require.NoError(t, err)
			done := make(chan error, 2)
			wait := func(c *locks.Container, owner string) {
				done <- c.Locks.Do(ctx, owner, ref, application.AcquireOptions{Wait: true, TTL: time.Hour},
					func(context.Context, domain.Lock) error { return nil })
			}
			go wait(b, "b")
			untilWaiting(t, b, ref, 1, "b's waiter")
			go wait(a, "a")
			untilWaiting(t, a, ref, 1, "a's waiter")
			_, err = h.Release(ctx)
			require.NoError(t, err)
			for n := range 2 {
				select {
				case err := <-done:
					require.NoError(t, err)
				case <-time.After(10 * time.Second):
					t.Fatalf("round %d: %d of 2 waits ended; Waiting a=%d b=%d, timers pending: %v",
						i, n, a.Locks.Waiting(ref), b.Locks.Waiting(ref), clk.PendingIn())
				}
			}
		}
	}
	t.Run("sqlite", func(t *testing.T) { run(t, filepath.Join(t.TempDir(), "agents.db"), 50) })
	t.Run("postgres", func(t *testing.T) {
		if os.Getenv("LOCKS_TEST_POSTGRES_DSN") == "" {
			t.Skip("LOCKS_TEST_POSTGRES_DSN is not set")
		}
		run(t, testdb.Postgres(t), 50)
	})
}

// A Timeout counts from the clock as it reads, not as the service records
// times (to the microsecond): on a clock 500ns past a microsecond, a move
// that leaves 200ns of the Timeout, past the holder's expiry, lets the
// waiter take the lock.
func TestTimeTravel_TimeoutCountsFromTheClockAsItReads(t *testing.T) {
	timeTravelStores(t, func(t *testing.T, cfg locks.Config, _ int) {
		waitThenTravelBy(t, cfg, time.Date(2026, 12, 1, 9, 0, 0, 500, time.UTC), 31*time.Second, 31*time.Second-200*time.Nanosecond)
	})
}
