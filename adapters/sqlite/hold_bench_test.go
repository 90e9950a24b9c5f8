package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// BenchmarkOneResource is 8 goroutines (each its own owner) taking turns
// on one resource of a SQLite file: one op is one hand-over, an
// acquire+release cycle that succeeded. Compare the sub-benchmarks of one
// run with benchstat:
//   - Floor: a hand-written adapter (one writing connection, the same
//     statements) whose callers retry at once while the resource is held;
//   - ServicePolling: the service's plain Acquire, retried at once on a
//     conflict, as embedders had to write it;
//   - ServiceWaiting: Take with Wait, woken in arrival order by the
//     release, polling nothing.
func BenchmarkOneResource(b *testing.B) {
	ctx := context.Background()
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "bench-plan"}
	parallel := max(1, 8/runtime.GOMAXPROCS(0))

	b.Run("Floor", func(b *testing.B) {
		f := mustOpenFloor(b)
		var workers atomic.Int64
		b.SetParallelism(parallel)
		b.RunParallel(func(pb *testing.PB) {
			owner := fmt.Sprintf("bench-host:%d:00000000", workers.Add(1))
			for pb.Next() {
				for {
					err := f.acquire(ctx, owner, string(ref.Type), ref.ID, benchTTL)
					if err == nil {
						break
					}
					if err.Error() != fmt.Sprintf("%s/%s is already locked", ref.Type, ref.ID) {
						b.Error(err)
						return
					}
				}
				if _, err := f.del.ExecContext(ctx, string(ref.Type), ref.ID, owner); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})

	b.Run("ServicePolling", func(b *testing.B) {
		c := mustOpenContainer(b)
		var workers atomic.Int64
		b.SetParallelism(parallel)
		b.RunParallel(func(pb *testing.PB) {
			owner := fmt.Sprintf("bench-host:%d:00000000", workers.Add(1))
			for pb.Next() {
				for {
					_, err := c.Locks.Acquire(ctx, owner, ref, benchTTL)
					if err == nil {
						break
					}
					if !errors.Is(err, domain.ErrConflict) {
						b.Error(err)
						return
					}
				}
				if _, err := c.Locks.Release(ctx, owner, ref); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})

	b.Run("ServiceWaiting", func(b *testing.B) {
		c := mustOpenContainer(b)
		var workers atomic.Int64
		opts := application.AcquireOptions{TTL: benchTTL, Wait: true}
		b.SetParallelism(parallel)
		b.RunParallel(func(pb *testing.PB) {
			owner := fmt.Sprintf("bench-host:%d:00000000", workers.Add(1))
			for pb.Next() {
				h, err := c.Locks.Take(ctx, owner, ref, opts)
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := h.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
