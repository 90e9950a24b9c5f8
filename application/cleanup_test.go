package application_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
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
