package tests

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// Many goroutines of one process share one container, each acting as its
// own owner. Run under -race, this shows the service, the SQLite adapter's
// writer queue and the container safe for concurrent use.
func TestGoroutines_MutualExclusion(t *testing.T) {
	for _, db := range []string{"file", locks.MemoryDatabase} {
		t.Run(db, func(t *testing.T) {
			if db == "file" {
				db = filepath.Join(t.TempDir(), "agents.db")
			}
			c := MustOpen(t, locks.Config{Database: db})
			const workers = 32
			dur := stressDuration() / 3
			type entry struct {
				token int64
				owner string
			}
			var (
				wg      sync.WaitGroup
				inside  [3]atomic.Int32
				mu      [3]sync.Mutex
				logs    [3][]entry
				errs    atomic.Int64
				overlap atomic.Int64
				entered atomic.Int64
				handed  atomic.Int64 // entries by another owner than the last
				stop    = make(chan struct{})
			)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					owner := fmt.Sprintf("%s/g%02d", c.Owner(), w)
					for i := w; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						r := i % len(stressResources)
						ref := stressResources[r]
						l, err := c.Locks.Acquire(context.Background(), owner, ref, time.Minute)
						if errors.Is(err, domain.ErrConflict) {
							// A poller's pause: 32 goroutines retrying at
							// once starve the holder of the two cores, and
							// under load the locks hardly change hands.
							time.Sleep(200 * time.Microsecond)
							continue
						}
						if err != nil {
							errs.Add(1)
							t.Errorf("acquire: %v", err)
							return
						}
						// The critical section. It lasts a while, as work
						// under a lock does, so that a second holder of the
						// same lock, if the service let one in, is caught
						// inside with the first, on entry or by the exit:
						// without the wait it passed unseen.
						if inside[r].Add(1) != 1 {
							overlap.Add(1)
						}
						mu[r].Lock()
						if n := len(logs[r]); n > 0 && logs[r][n-1].owner != owner {
							handed.Add(1)
						}
						logs[r] = append(logs[r], entry{l.Token, owner})
						mu[r].Unlock()
						entered.Add(1)
						time.Sleep(50 * time.Microsecond) // the work done under the lock
						if inside[r].Add(-1) != 0 {
							overlap.Add(1)
						}
						if ok, err := c.Locks.Release(context.Background(), owner, ref); err != nil || !ok {
							errs.Add(1)
							t.Errorf("release: %v %v", ok, err)
							return
						}
					}
				}()
			}
			// The run's length (not a wait for an expiry): at least dur, and
			// longer, on a machine so loaded that the locks have hardly
			// changed hands yet: until they have, however long that takes.
			start := time.Now()
			for {
				time.Sleep(dur / 10)
				if time.Since(start) >= dur && handed.Load() > 10 {
					break
				}
			}
			close(stop)
			ran := time.Since(start).Round(time.Millisecond)
			wg.Wait()

			entries, handoffs, disorder := 0, 0, 0
			for r := range logs {
				for i, e := range logs[r] {
					if i > 0 {
						if e.token <= logs[r][i-1].token {
							disorder++
						}
						if e.owner != logs[r][i-1].owner {
							handoffs++
						}
					}
				}
				entries += len(logs[r])
			}
			t.Logf("%d goroutines, %v: %d entries, %d handoffs, %d overlaps, %d tokens out of order, %d errors",
				workers, ran, entries, handoffs, overlap.Load(), disorder, errs.Load())
			assert.Zero(t, overlap.Load(), "two goroutines were inside the critical section of one resource at once")
			assert.Zero(t, disorder, "tokens increase in the order of entry")
			assert.Zero(t, errs.Load())
			assert.Greater(t, handoffs, 10, "the locks changed hands")
		})
	}
}
