package sqlite_test

// Benchmarks of one uncontended acquire+release cycle on a SQLite file:
// through the lock service (rules, write queue and retry, Ent), through Ent
// alone, and by hand on database/sql with the same driver, DSN and SQL
// statements (the floor). Their ratios say what each layer costs; the
// figures and how to reproduce them are in docs/performance.md.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	_ "modernc.org/sqlite"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/ent"
	entlock "github.com/cleveragents/locks/ent/lock"
)

const (
	benchOwner = "bench-host:1:00000000"
	benchTTL   = 5 * time.Minute
	// timeLayout is the adapter's stored time format (entstore.FormatTime).
	timeLayout = "2006-01-02T15:04:05.000000Z"
)

// The statements the adapter runs for the service's cycle (entstore's buildStatements,
// pinned by TestStatements): Acquire runs the first two in one immediate
// transaction; Release runs the third on its own. The floor prepares them,
// as the adapter does.
const (
	floorSelect = "SELECT `id`, `owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at` FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ?"
	floorInsert = "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`) VALUES (?, ?, ?, ?, ?) RETURNING `id`"
	floorDelete = "DELETE FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ? AND `owner_id` = ?"
)

// BenchmarkAcquireRelease_Service is one Acquire+Release of a free
// resource through the container's lock service, with the real clock.
func BenchmarkAcquireRelease_Service(b *testing.B) {
	ctx := context.Background()
	c := mustOpenContainer(b)
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "bench-plan"}
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if _, err := c.Locks.Acquire(ctx, benchOwner, ref, benchTTL); err != nil {
			b.Fatal(err)
		}
		if ok, err := c.Locks.Release(ctx, benchOwner, ref); err != nil || !ok {
			b.Fatalf("release: %v, %v", ok, err)
		}
	}
}

// BenchmarkAcquireRelease_Ent is the adapter's Ent calls for the same
// cycle on a plain Ent client: no service, no write queue, no retry. It
// separates the cost of Ent from the cost of the layers above it.
func BenchmarkAcquireRelease_Ent(b *testing.B) {
	ctx := context.Background()
	client := ent.NewClient(ent.Driver(entsql.OpenDB(dialect.SQLite, mustOpenFloor(b).db)))
	typ, id := string(domain.ResourcePlan), "bench-plan"
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if err := entAcquire(ctx, client, benchOwner, typ, id, benchTTL); err != nil {
			b.Fatal(err)
		}
		n, err := client.Lock.Delete().
			Where(entlock.And(entlock.ResourceType(typ), entlock.ResourceID(id)), entlock.OwnerID(benchOwner)).
			Exec(ctx)
		if err != nil || n != 1 {
			b.Fatalf("release: %d rows, %v", n, err)
		}
	}
}

// BenchmarkAcquireRelease_Floor is the same cycle as a hand-written
// adapter would run it: database/sql, the adapter's DSN, the same prepared
// statements on one writing connection, and no layers above.
func BenchmarkAcquireRelease_Floor(b *testing.B) {
	ctx := context.Background()
	f := mustOpenFloor(b)
	typ, id := string(domain.ResourcePlan), "bench-plan"
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if err := f.acquire(ctx, benchOwner, typ, id, benchTTL); err != nil {
			b.Fatal(err)
		}
		res, err := f.del.ExecContext(ctx, typ, id, benchOwner)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			b.Fatalf("release: %d rows, %v", n, err)
		}
	}
}

// BenchmarkAcquireRelease_ServiceContended runs the cycle through the
// service from 4 goroutines per core, each its own owner, over 4
// resources: for information only, since a cycle that meets a conflict
// writes nothing. conflicts/op is the share of acquires that found the
// resource held.
func BenchmarkAcquireRelease_ServiceContended(b *testing.B) {
	ctx := context.Background()
	c := mustOpenContainer(b)
	var workers, conflicts atomic.Int64
	b.ReportAllocs()
	defer reportCPU(b)()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		w := workers.Add(1)
		owner := fmt.Sprintf("bench-host:%d:00000000", w)
		for i := int(w); pb.Next(); i++ {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("bench-plan-", i%4)}
			_, err := c.Locks.Acquire(ctx, owner, ref, benchTTL)
			if errors.Is(err, domain.ErrConflict) {
				conflicts.Add(1)
				continue
			}
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := c.Locks.Release(ctx, owner, ref); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(conflicts.Load())/float64(b.N), "conflicts/op")
}

// floor is a hand-written adapter: one writing connection and its
// prepared statements.
type floor struct {
	db               *sql.DB
	sel, insert, del *sql.Stmt
}

// acquire takes the lock on a resource that must be free: the read and
// the insert in one immediate transaction, as the adapter does.
func (f *floor) acquire(ctx context.Context, owner, typ, id string, ttl time.Duration) (err error) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	tx, err := f.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: _txlock in the DSN
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var token int64
	switch err := tx.StmtContext(ctx, f.sel).QueryRowContext(ctx, typ, id).Scan(new(int64), new(string), new(string), new(string), new(string), new(string)); {
	case err == nil:
		return fmt.Errorf("%s/%s is already locked", typ, id)
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	err = tx.StmtContext(ctx, f.insert).QueryRowContext(ctx, owner, typ, id,
		now.Format(timeLayout), now.Add(ttl).Format(timeLayout)).Scan(&token)
	if err != nil {
		return err
	}
	return tx.Commit()
}

// entAcquire is floorAcquire written with the Ent calls of
// LockRepository.Update.
func entAcquire(ctx context.Context, client *ent.Client, owner, typ, id string, ttl time.Duration) (err error) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	tx, err := client.Tx(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	_, err = tx.Lock.Query().Where(entlock.And(entlock.ResourceType(typ), entlock.ResourceID(id))).Only(ctx)
	if !ent.IsNotFound(err) {
		return fmt.Errorf("%s/%s is already locked (%v)", typ, id, err)
	}
	_, err = tx.Lock.Create().
		SetOwnerID(owner).SetResourceType(typ).SetResourceID(id).
		SetAcquiredAt(now.Format(timeLayout)).SetExpiresAt(now.Add(ttl).Format(timeLayout)).
		Save(ctx)
	if err != nil {
		return err
	}
	return tx.Commit()
}

// reportCPU returns a function, to defer before the benchmark loop, that
// reports the process's CPU time (user+system, all threads) per iteration.
// On a shared machine it moves less than wall time, which also counts the
// time spent waiting for a CPU.
func reportCPU(b *testing.B) func() {
	start, ok := processCPU()
	return func() {
		if end, ok2 := processCPU(); ok && ok2 && b.N > 0 {
			b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func mustOpenContainer(tb testing.TB) *locks.Container {
	tb.Helper()
	return mustOpenContainerAt(tb, filepath.Join(tb.TempDir(), "locks.db"))
}

func mustOpenContainerAt(tb testing.TB, database string) *locks.Container {
	tb.Helper()
	c, err := locks.Open(context.Background(), locks.Config{
		Database: database,
		Owner:    benchOwner,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// mustOpenFloor creates the schema with the adapter's migration, then
// opens the file again with plain database/sql, the adapter's DSN and one
// writing connection, and prepares the statements.
func mustOpenFloor(tb testing.TB) *floor {
	tb.Helper()
	ctx := context.Background()
	path := filepath.Join(tb.TempDir(), "locks.db")
	adb, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	if err := adb.Close(); err != nil {
		tb.Fatal(err)
	}
	dsn, err := sqlite.DSN(path, 0)
	if err != nil {
		tb.Fatal(err)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	tb.Cleanup(func() { db.Close() })
	f := &floor{db: db}
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{{&f.sel, floorSelect}, {&f.insert, floorInsert}, {&f.del, floorDelete}} {
		if *p.stmt, err = db.PrepareContext(ctx, p.query); err != nil {
			tb.Fatal(err)
		}
	}
	return f
}
