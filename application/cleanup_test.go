package application_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// timedBatches is a store with rows expired locks whose DeleteExpired
// takes perRow() of the mock clock for each row it deletes, and records
// the limit of every call.
type timedBatches struct {
	failingRepo
	mc     *clock.Mock
	rows   int
	perRow func() time.Duration
	limits []int
}

// CountExpired counts the rows left, as an honest store does.
func (r *timedBatches) CountExpired(context.Context, time.Time) (int, error) { return r.rows, nil }

func (r *timedBatches) DeleteExpired(_ context.Context, _ time.Time, limit int) (int, error) {
	r.limits = append(r.limits, limit)
	n := min(limit, r.rows)
	r.rows -= n
	var took time.Duration
	for range n {
		took += r.perRow()
	}
	r.mc.Add(took)
	return n, nil
}

func TestLockService_CleanupBatchesSizedByTime(t *testing.T) {
	ctx := context.Background()
	run := func(t *testing.T, rows int, perRow func() time.Duration) []int {
		t.Helper()
		mc := clock.NewMock()
		repo := &timedBatches{mc: mc, rows: rows, perRow: perRow}
		svc, err := application.NewLockService(repo, mc, 0)
		require.NoError(t, err)
		n, err := svc.CleanupExpired(ctx)
		require.NoError(t, err)
		assert.Equal(t, rows, n, "every expired lock is purged")
		return repo.limits
	}
	each := func(d time.Duration) func() time.Duration { return func() time.Duration { return d } }

	t.Run("ConvergesOnAMillisecond", func(t *testing.T) {
		// 2 µs a row: 500 rows make the millisecond a batch aims at. The
		// size grows at most twofold a batch, from 100.
		limits := run(t, 3000, each(2*time.Microsecond))
		assert.Equal(t, []int{100, 200, 400, 500, 500, 500, 500, 500}, limits)
	})
	t.Run("SlowBatchShrinksTheNextAtOnce", func(t *testing.T) {
		// The store slows down tenfold after 1200 rows (a busy disk): the
		// batch after the first slow one shrinks to what fits in a
		// millisecond at the new rate, not halfway.
		deleted := 0
		limits := run(t, 1940, func() time.Duration {
			deleted++
			if deleted > 1200 {
				return 20 * time.Microsecond
			}
			return 2 * time.Microsecond
		})
		assert.Equal(t, []int{100, 200, 400, 500, 500, 50, 50, 50, 50, 50}, limits)
	})
	t.Run("FastStoreGrowsToTheCap", func(t *testing.T) {
		limits := run(t, 100_000, each(0))
		assert.Equal(t, []int{100, 200, 400, 800, 1600, 3200, 6400, 12800, 20000, 20000, 20000, 20000}, limits,
			"a batch that takes no time doubles the next, up to 20000")
	})
	t.Run("VerySlowStoreKeepsAFloor", func(t *testing.T) {
		limits := run(t, 150, each(time.Second))
		assert.Equal(t, []int{100, 20, 20, 20}, limits,
			"100 s for 100 rows: the next batch still deletes 20, so that cleanup ends")
	})
}

// flakyStore is the memory store whose DeleteExpired fails while failing
// is set, as a busy database does.
type flakyStore struct {
	*memory.LockRepository
	failing atomic.Bool
}

var errBusy = &domain.StoreError{Op: "clean up expired locks", Kind: domain.StoreBusy}

func (r *flakyStore) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if r.failing.Load() {
		return 0, errBusy
	}
	return r.LockRepository.DeleteExpired(ctx, now, limit)
}

// blockingStore is the memory store whose DeleteExpired waits until its
// context ends, as a write stuck behind a long one does.
type blockingStore struct {
	*memory.LockRepository
	entered chan struct{}
}

func (r *blockingStore) DeleteExpired(ctx context.Context, _ time.Time, _ int) (int, error) {
	r.entered <- struct{}{}
	<-ctx.Done()
	return 0, ctx.Err()
}

// cleanupRun is what StartCleanup's onRun received.
type cleanupRun struct {
	purged int
	err    error
}

func startCleanup(t *testing.T, svc *application.LockService, interval time.Duration) (*application.PeriodicCleanup, chan cleanupRun) {
	t.Helper()
	runs := make(chan cleanupRun, 10)
	p, err := svc.StartCleanup(interval, func(n int, err error) { runs <- cleanupRun{n, err} })
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	return p, runs
}

// nextRun returns the report of the next run. The loop runs as soon as
// the mock clock fires its timer; the deadline only turns a loop that
// died into a failure instead of a hung test.
func nextRun(t *testing.T, runs <-chan cleanupRun) cleanupRun {
	t.Helper()
	select {
	case r := <-runs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no cleanup ran after the interval passed")
		return cleanupRun{}
	}
}

// expireOne stores a lock of owner "dead" on plan and lets it expire.
func expireOne(t *testing.T, svc *application.LockService, mc *clock.Mock) {
	t.Helper()
	_, err := svc.Acquire(context.Background(), "dead", plan, domain.MinLockTTL)
	require.NoError(t, err)
	mc.Add(domain.MinLockTTL)
	requireStale(t, svc, 1)
}

func requireStale(t *testing.T, svc *application.LockService, want int) {
	t.Helper()
	n, err := svc.StaleCount(context.Background())
	require.NoError(t, err)
	require.Equal(t, want, n)
}

func TestLockService_StartCleanup(t *testing.T) {
	const interval = time.Minute

	t.Run("PurgesOnceTheIntervalHasPassed", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		mc := clock.NewMock()
		svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
		require.NoError(t, err)
		p, runs := startCleanup(t, svc, interval)
		expireOne(t, svc, mc) // 5 s into the interval

		mc.Add(interval - domain.MinLockTTL - time.Microsecond)
		requireStale(t, svc, 1)
		require.Empty(t, runs, "no run before the interval has passed")

		mc.Add(time.Microsecond)
		require.Equal(t, cleanupRun{purged: 1}, nextRun(t, runs))
		requireStale(t, svc, 0)

		// And again an interval after that run.
		expireOne(t, svc, mc)
		mc.Add(interval - domain.MinLockTTL)
		require.Equal(t, cleanupRun{purged: 1}, nextRun(t, runs))
		requireStale(t, svc, 0)
		p.Stop()
	})

	t.Run("SurvivesAFailingStore", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		mc := clock.NewMock()
		repo := &flakyStore{LockRepository: memory.NewLockRepository()}
		svc, err := application.NewLockService(repo, mc, 0)
		require.NoError(t, err)
		p, runs := startCleanup(t, svc, interval)
		expireOne(t, svc, mc)

		repo.failing.Store(true)
		mc.Add(interval)
		run := nextRun(t, runs)
		require.ErrorIs(t, run.err, errBusy, "the failure is reported")
		requireStale(t, svc, 1)

		repo.failing.Store(false)
		mc.Add(interval)
		require.Equal(t, cleanupRun{purged: 1}, nextRun(t, runs), "the next interval runs again")
		requireStale(t, svc, 0)
		p.Stop()
	})

	t.Run("StopCutsARunShortAndEndsTheGoroutine", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		mc := clock.NewMock()
		repo := &blockingStore{LockRepository: memory.NewLockRepository(), entered: make(chan struct{}, 1)}
		svc, err := application.NewLockService(repo, mc, 0)
		require.NoError(t, err)
		p, runs := startCleanup(t, svc, interval)
		mc.Add(interval)
		<-repo.entered
		p.Stop() // returns only once the run and the goroutine have ended
		require.Empty(t, runs, "a run cut short by Stop is no failure to report")
		require.NoError(t, svc.Close(context.Background()), "nothing left for Close to wait for")
		p.Stop()
	})

	t.Run("EndsWhenTheServiceCloses", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		mc := clock.NewMock()
		svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
		require.NoError(t, err)
		runs := make(chan cleanupRun, 1)
		_, err = svc.StartCleanup(interval, func(n int, err error) { runs <- cleanupRun{n, err} })
		require.NoError(t, err)
		require.NoError(t, svc.Close(context.Background()))
		mc.Add(interval)
		// goleak.VerifyNone checks that the loop has ended, without Stop.
		require.Empty(t, runs)
	})

	t.Run("RefusesAShortInterval", func(t *testing.T) {
		svc, err := application.NewLockService(memory.NewLockRepository(), clock.NewMock(), 0)
		require.NoError(t, err)
		for _, d := range []time.Duration{-time.Minute, 0, time.Second, application.MinCleanupInterval - 1} {
			_, err := svc.StartCleanup(d, nil)
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve, d)
			assert.Equal(t, "cleanup_interval", ve.Field)
		}
	})
}

// reportsFullBatches holds held expired locks and removes them, but its
// DeleteExpired reports its limit whatever it removed (a store that
// returns the limit it bound, not the rows it deleted); its CountExpired
// counts what is left, honestly or, when countLeft is set, not.
type reportsFullBatches struct {
	failingRepo
	held      int
	countLeft int // what CountExpired says, when not -1
	batches   atomic.Int64
}

func (r *reportsFullBatches) DeleteExpired(_ context.Context, _ time.Time, limit int) (int, error) {
	r.batches.Add(1)
	r.held -= min(limit, r.held)
	return limit, nil
}

func (r *reportsFullBatches) CountExpired(context.Context, time.Time) (int, error) {
	if r.countLeft >= 0 {
		return r.countLeft, nil
	}
	return r.held, nil
}

// A purge loops until a batch comes back short of its limit: on a store
// whose DeleteExpired never does, it stops with an error that names the
// broken promise, instead of looping for ever (a loop the contract suite
// hung in).
func TestLockService_CleanupEndsOnAStoreThatReportsFullBatches(t *testing.T) {
	for _, tc := range []struct {
		name      string
		countLeft int
	}{
		{"HonestCount", -1},
		{"CountThatNeverDrops", 5000}, // CountExpired lies too
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := &reportsFullBatches{held: 250, countLeft: tc.countLeft}
			svc, err := application.NewLockService(repo, clock.NewMock(), 0)
			require.NoError(t, err)
			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				n, err := svc.CleanupExpired(ctx)
				done <- result{n, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				cancel()
				<-done
				t.Fatalf("CleanupExpired still looped after %d batches on a store whose DeleteExpired always reports its limit", repo.batches.Load())
			}
			require.ErrorIs(t, r.err, domain.ErrUnavailable)
			assert.Contains(t, r.err.Error(), "DeleteExpired reported removing")
			assert.Contains(t, r.err.Error(), "fewer than its limit once no more have expired")
			t.Logf("after %d batches: %v", repo.batches.Load(), r.err)
		})
	}
}
