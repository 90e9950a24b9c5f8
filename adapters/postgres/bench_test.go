package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

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
