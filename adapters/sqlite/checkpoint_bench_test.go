package sqlite_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// BenchmarkCheckpoints is a lone caller's acquire+release cycle, back to
// back, with the largest size the WAL file reached (wal-MiB): whether the
// background catch-ups keep up with writes that never wait for them,
// which TestCheckpoints cannot assert (it depends on the machine's speed
// and load). Without checkpoints, each cycle adds about 32 KiB.
func BenchmarkCheckpoints(b *testing.B) {
	ctx := context.Background()
	path := b.TempDir() + "/locks.db"
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	svc, err := application.NewLockService(sqlite.NewLockRepository(db), clock.New(), 0)
	if err != nil {
		b.Fatal(err)
	}
	var largest int64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p" + string(rune('a'+i%26))}
		if _, err := svc.Acquire(ctx, "alice", ref, time.Minute); err != nil {
			b.Fatal(err)
		}
		if _, err := svc.Release(ctx, "alice", ref); err != nil {
			b.Fatal(err)
		}
		if i%64 == 0 {
			if fi, err := os.Stat(path + "-wal"); err == nil {
				largest = max(largest, fi.Size())
			}
		}
	}
	b.ReportMetric(float64(largest)/(1<<20), "wal-MiB")
}
