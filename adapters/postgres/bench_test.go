package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// BenchmarkAcquireRelease_Service is one uncontended Acquire+Release
// through the lock service on PostgreSQL, for comparison with the same
// benchmark on SQLite (adapters/sqlite); see docs/performance.md.
func BenchmarkAcquireRelease_Service(b *testing.B) {
	ctx := context.Background()
	db, err := postgres.Open(ctx, testdb.Postgres(b), postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0)
	if err != nil {
		b.Fatal(err)
	}
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "bench-plan"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.Acquire(ctx, "bench", ref, 5*time.Minute); err != nil {
			b.Fatal(err)
		}
		if ok, err := svc.Release(ctx, "bench", ref); err != nil || !ok {
			b.Fatalf("release: %v, %v", ok, err)
		}
	}
}

// BenchmarkCycle compares an Acquire+Release cycle through the service
// (a container from locks.Open, as an embedder gets it: the server's
// clock, the one-statement acquire) with the lease floor: a hand-written
// lock on its own pool whose acquire is one prepared statement,
// INSERT ... ON CONFLICT DO UPDATE ... WHERE expired RETURNING id, and
// whose release is one prepared DELETE. Each of callers goroutines cycles
// its own resource; ns/op is the wall time per cycle of them all, and
// cycles/s its inverse. See docs/performance.md for how it is run.
func BenchmarkCycle(b *testing.B) {
	for _, callers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			b.Run("impl=Floor", func(b *testing.B) { benchFloor(b, callers) })
			b.Run("impl=Service", func(b *testing.B) { benchService(b, callers) })
		})
	}
}

func benchService(b *testing.B, callers int) {
	ctx := context.Background()
	dsn, server := serverCPU(b, testdb.Postgres(b), "locks-bench-service")
	c, err := locks.Open(ctx, locks.Config{Database: dsn, Owner: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	runCycles(b, callers, server, func(ref domain.ResourceRef) error {
		if _, err := c.Locks.Acquire(ctx, c.Owner(), ref, 5*time.Minute); err != nil {
			return err
		}
		if ok, err := c.Locks.Release(ctx, c.Owner(), ref); err != nil || !ok {
			return fmt.Errorf("release: %v, %v", ok, err)
		}
		return nil
	})
}

// BenchmarkGroupCommit compares the store with and without group commit
// (Options.DisableGroupCommit), each through a lock service on the
// server's clock with the store's wake-ups, as locks.Open makes it,
// cycling as BenchmarkCycle's Service does. Run it
// interleaved, the one beside the other:
//
//	go test -c -o /tmp/pg.test ./adapters/postgres
//	for i in 1 2 3 4 5 6; do /tmp/pg.test -test.run '^$' \
//	  -test.bench 'GroupCommit/callers=32' -test.benchtime 2s; done
func BenchmarkGroupCommit(b *testing.B) {
	for _, callers := range []int{8, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			for _, disabled := range []bool{false, true} {
				b.Run(fmt.Sprintf("disabled=%v", disabled), func(b *testing.B) {
					benchStore(b, callers, postgres.Options{DisableGroupCommit: disabled})
				})
			}
		})
	}
}

func benchStore(b *testing.B, callers int, opts postgres.Options) {
	ctx := context.Background()
	dsn, server := serverCPU(b, testdb.Postgres(b), "locks-bench-store")
	db, err := postgres.Open(ctx, dsn, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	clk, err := postgres.NewServerClock(ctx, db, postgres.SystemClock{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(clk.Close)
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clk, 0,
		application.WithWakeups(db.Wakeups())) // as locks.Open does
	if err != nil {
		b.Fatal(err)
	}
	runCycles(b, callers, server, func(ref domain.ResourceRef) error {
		if _, err := svc.Acquire(ctx, "bench", ref, 5*time.Minute); err != nil {
			return err
		}
		if ok, err := svc.Release(ctx, "bench", ref); err != nil || !ok {
			return fmt.Errorf("release: %v, %v", ok, err)
		}
		return nil
	})
}

// The lease floor's statements. Its acquire keeps the row's id on a
// takeover, which the service must not; every acquire here finds the
// resource free.
const (
	floorAcquire = `INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (resource_type, resource_id) DO UPDATE
SET owner_id = EXCLUDED.owner_id, acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
WHERE locks.expires_at <= EXCLUDED.acquired_at
RETURNING id`
	floorRelease = `DELETE FROM locks WHERE resource_type = $1 AND resource_id = $2 AND owner_id = $3`
)

func benchFloor(b *testing.B, callers int) {
	ctx := context.Background()
	dsn, server := serverCPU(b, testdb.Postgres(b), "locks-bench-floor")
	db, err := postgres.Open(ctx, dsn, postgres.Options{}) // the same table
	if err != nil {
		b.Fatal(err)
	}
	db.Close()
	pool, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Close() })
	pool.SetMaxOpenConns(10) // as the store's pool
	pool.SetMaxIdleConns(10)
	acquire, err := pool.PrepareContext(ctx, floorAcquire)
	if err != nil {
		b.Fatal(err)
	}
	release, err := pool.PrepareContext(ctx, floorRelease)
	if err != nil {
		b.Fatal(err)
	}
	const layout = "2006-01-02T15:04:05.000000Z"
	runCycles(b, callers, server, func(ref domain.ResourceRef) error {
		now := time.Now().UTC().Truncate(time.Microsecond)
		var id int64
		err := acquire.QueryRowContext(ctx, "bench", string(ref.Type), ref.ID,
			now.Format(layout), now.Add(5*time.Minute).Format(layout)).Scan(&id)
		if err != nil {
			return err
		}
		res, err := release.ExecContext(ctx, string(ref.Type), ref.ID, "bench")
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("release removed %d rows", n)
		}
		return nil
	})
}

// runCycles runs b.N cycles, shared among callers goroutines, each on a
// resource of its own. It reports cycles/s and, when server is not nil,
// the server's CPU time per cycle (server-µs/cycle; see serverCPU).
func runCycles(b *testing.B, callers int, server func() time.Duration, cycle func(domain.ResourceRef) error) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, callers)
	)
	b.ReportAllocs()
	var cpu0 time.Duration
	if server != nil {
		cpu0 = server()
	}
	b.ResetTimer()
	start := time.Now()
	for i := range callers {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("bench-", i)}
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := cycle(ref); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
	if server != nil {
		b.ReportMetric(float64((server()-cpu0).Microseconds())/float64(b.N), "server-µs/cycle")
	}
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
