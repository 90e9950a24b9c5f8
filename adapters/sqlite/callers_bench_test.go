package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// BenchmarkCallers is the acquire+release cycle from 1, 8 and 32
// goroutines at once, each its own owner cycling its own resource, so
// that no acquire meets a conflict: what concurrent callers of one process
// get from group commit, against the floor's one transaction per write.
// One op is one cycle of one caller.
func BenchmarkCallers(b *testing.B) {
	for _, callers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("impl=Floor/callers=%d", callers), func(b *testing.B) {
			ctx := context.Background()
			f := mustOpenFloor(b)
			runCallers(b, callers, func(owner, id string) error {
				typ := string(domain.ResourcePlan)
				if err := f.acquire(ctx, owner, typ, id, benchTTL); err != nil {
					return err
				}
				_, err := f.del.ExecContext(ctx, typ, id, owner)
				return err
			})
		})
		b.Run(fmt.Sprintf("impl=Service/callers=%d", callers), func(b *testing.B) {
			benchService(b, mustOpenContainer(b), callers)
		})
		b.Run(fmt.Sprintf("impl=ServiceFull/callers=%d", callers), func(b *testing.B) {
			// synchronous=FULL: one fsync per commit, which group commit
			// shares among the writes of a batch.
			path := filepath.Join(b.TempDir(), "locks.db")
			benchService(b, mustOpenContainerAt(b, "file:"+path+"?_synchronous=FULL"), callers)
		})
	}
}

// BenchmarkCallers_Transactions is BenchmarkCallers' service cycle on a
// DB of its own, to report how many writes share a transaction (group
// commit's gain, which the cycle rate alone hides on a loaded machine).
func BenchmarkCallers_Transactions(b *testing.B) {
	for _, callers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			ctx := context.Background()
			db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "locks.db"), sqlite.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			svc, err := application.NewLockService(sqlite.NewLockRepository(db), systemClock{}, benchTTL,
				application.WithWakeups(db.Wakeups()))
			if err != nil {
				b.Fatal(err)
			}
			runCallers(b, callers, func(owner, id string) error {
				ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: id}
				if _, err := svc.Acquire(ctx, owner, ref, benchTTL); err != nil {
					return err
				}
				_, err := svc.Release(ctx, owner, ref)
				return err
			})
			st := db.WriteStats()
			b.ReportMetric(float64(st.Writes)/float64(st.Transactions), "writes/tx")
			b.ReportMetric(float64(st.Writes-st.Shared)/float64(st.Transactions), "lone/tx")
		})
	}
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// benchService runs the service's cycle on c from callers goroutines.
func benchService(b *testing.B, c *locks.Container, callers int) {
	ctx := context.Background()
	runCallers(b, callers, func(owner, id string) error {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: id}
		if _, err := c.Locks.Acquire(ctx, owner, ref, benchTTL); err != nil {
			return err
		}
		ok, err := c.Locks.Release(ctx, owner, ref)
		if err == nil && !ok {
			err = fmt.Errorf("release of %s found no lock", id)
		}
		return err
	})
}

// runCallers runs cycle from exactly callers goroutines until b.N cycles
// are done in all.
func runCallers(b *testing.B, callers int, cycle func(owner, id string) error) {
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	defer reportCPU(b)()
	var wg sync.WaitGroup
	for w := range callers {
		owner := fmt.Sprintf("bench-host:%d:00000000", w)
		id := fmt.Sprint("bench-plan-", w)
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := cycle(owner, id); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
