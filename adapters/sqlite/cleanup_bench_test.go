package sqlite_test

// A benchmark of what purging a large backlog of expired locks costs the
// writers that keep working meanwhile: one goroutine cycles Acquire+Release
// on its own resource while cleanup deletes 500,000 expired rows from the
// same SQLite file. The figures, and how to reproduce them, are in
// docs/performance.md.

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// expiredRows is the backlog each iteration purges.
const expiredRows = 500_000

// fixedBatch is the batch size cleanup used before it sized its batches by
// time: the baseline.
const fixedBatch = 1000

// BenchmarkCleanupExpired purges expiredRows expired locks while another
// goroutine cycles Acquire+Release on a resource of its own, and reports
// the acquirer's worst and 99th-percentile cycle during the purge
// (worst-cycle-ms, p99-cycle-ms), its number of cycles, and how long the
// purge took (cleanup-ms/op).
//
//   - Service: LockService.CleanupExpired, batches sized by time.
//   - Fixed1000: the repository's DeleteExpired in a loop of fixed
//     1000-row batches, as cleanup used to run: the baseline.
//   - Idle: no purge; the acquirer cycles for idleFor on the same file:
//     what the acquirer's cycles look like without any cleanup.
//
// One iteration fills a file and purges it, which takes seconds: run it
// with -test.benchtime 1x.
func BenchmarkCleanupExpired(b *testing.B) {
	service := func(ctx context.Context, svc *application.LockService, _ application.LockRepository) (int, error) {
		return svc.CleanupExpired(ctx)
	}
	b.Run("Service", func(b *testing.B) { benchCleanup(b, service) })
	b.Run("Fixed1000", func(b *testing.B) {
		benchCleanup(b, func(ctx context.Context, _ *application.LockService, repo application.LockRepository) (int, error) {
			now := time.Now().UTC().Truncate(application.Precision)
			total := 0
			for {
				n, err := repo.DeleteExpired(ctx, now, fixedBatch)
				total += n
				if err != nil || n < fixedBatch {
					return total, err
				}
			}
		})
	})
	b.Run("Idle", func(b *testing.B) { benchCleanup(b, nil) })
}

// idleFor is how long the Idle case lets the acquirer cycle.
const idleFor = 5 * time.Second

type cleanupFunc func(context.Context, *application.LockService, application.LockRepository) (int, error)

// benchCleanup measures purge (nil: none, for idleFor) on a new file.
func benchCleanup(b *testing.B, purge cleanupFunc) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	repo := sqlite.NewLockRepository(db)
	svc, err := application.NewLockService(repo, clock.New(), 0)
	if err != nil {
		b.Fatal(err)
	}
	var (
		cycles  []time.Duration
		elapsed time.Duration
	)
	for b.Loop() {
		b.StopTimer()
		fillExpired(b, path, expiredRows)
		b.StartTimer()

		stop := make(chan struct{})
		done := make(chan []time.Duration)
		started := make(chan struct{})
		go func() { done <- cycleUntil(b, svc, started, stop) }()
		<-started
		start := time.Now()
		n, err := expiredRows, error(nil)
		if purge != nil {
			n, err = purge(ctx, svc, repo)
		} else {
			time.Sleep(idleFor)
		}
		elapsed += time.Since(start)
		close(stop)
		cycles = append(cycles, <-done...)
		if err != nil || n != expiredRows {
			b.Fatalf("cleanup purged %d of %d rows: %v", n, expiredRows, err)
		}
		if purge == nil {
			b.StopTimer()
			if _, err := svc.CleanupExpired(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	slices.Sort(cycles)
	if len(cycles) == 0 {
		b.Fatal("the acquirer completed no cycle during the cleanup")
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(cycles[len(cycles)-1]), "worst-cycle-ms")
	b.ReportMetric(ms(cycles[len(cycles)*99/100]), "p99-cycle-ms")
	b.ReportMetric(float64(len(cycles))/float64(b.N), "cycles/op")
	if purge != nil {
		b.ReportMetric(ms(elapsed)/float64(b.N), "cleanup-ms/op")
	}
}

// cycleUntil acquires and releases one resource of its own until stop
// closes, and returns how long each cycle took. It closes started once
// its first cycle is done, so that the connections are warm when the
// cleanup begins.
func cycleUntil(b *testing.B, svc *application.LockService, started, stop chan struct{}) []time.Duration {
	ctx := context.Background()
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "bench-acquirer"}
	var cycles []time.Duration
	for i := 0; ; i++ {
		select {
		case <-stop:
			return cycles
		default:
		}
		start := time.Now()
		if _, err := svc.Acquire(ctx, benchOwner, ref, benchTTL); err != nil {
			b.Error(err)
			return cycles
		}
		if _, err := svc.Release(ctx, benchOwner, ref); err != nil {
			b.Error(err)
			return cycles
		}
		if i == 0 {
			close(started)
			continue
		}
		cycles = append(cycles, time.Since(start))
	}
}

// fillExpired inserts n locks that expired an hour ago, by hand in one
// transaction on a connection of its own: the fastest way to build the
// backlog, and no part of what is measured.
func fillExpired(b *testing.B, path string, n int) {
	b.Helper()
	ctx := context.Background()
	dsn, err := sqlite.DSN(path, 0)
	if err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`) VALUES (?, ?, ?, ?, ?)")
	if err != nil {
		b.Fatal(err)
	}
	expired := time.Now().UTC().Add(-time.Hour)
	for i := range n {
		// Distinct expiries, a microsecond apart, as a real backlog has.
		at := expired.Add(time.Duration(i) * time.Microsecond)
		if _, err := stmt.ExecContext(ctx, "dead-host:1:00000000", string(domain.ResourcePlan), fmt.Sprint("stale-", i),
			at.Add(-benchTTL).Format(timeLayout), at.Format(timeLayout)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	// Leave the WAL empty, as a long-running store's would be, so that the
	// purge does not pay for checkpointing the fill.
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		b.Fatal(err)
	}
}
