package tests

import (
	"context"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// inBubble runs, in a testing/synctest bubble on the real clock, a wait
// for a plan another owner holds for 30s (Do with Wait), a keep-alive
// through ten minutes, and the loss of a lock whose keep-alive stops:
// time.Sleep moves the bubble's clock, and each of them follows at once.
//
// SQLite's wait for a holder of another owner watches the database's wake
// file, whose read (inotify, in the network poller) does not block
// durably: the bubble's time would stand still while a waiter waits, so
// the test sets PollOnly. Without it, this test hangs in the first Sleep.
func inBubble(t *testing.T, cfg locks.Config) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		cfg.Owner, cfg.CleanupInterval = "me", time.Minute
		c, err := locks.Open(ctx, cfg)
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Locks.Acquire(ctx, "other", plan1, 30*time.Second)
		require.NoError(t, err)

		start := time.Now()
		done := make(chan error, 1)
		go func() {
			done <- c.Locks.Do(ctx, c.Owner(), plan1, application.AcquireOptions{Wait: true, Timeout: time.Minute, TTL: 10 * time.Second},
				func(ctx context.Context, l domain.Lock) error {
					time.Sleep(10 * time.Minute) // kept alive all along
					return ctx.Err()
				})
		}()
		synctest.Wait()
		require.Equal(t, 1, c.Locks.Waiting(plan1))
		time.Sleep(31 * time.Second)
		synctest.Wait()
		require.Equal(t, 0, c.Locks.Waiting(plan1), "taken once the holder expired")
		time.Sleep(10 * time.Minute)
		require.NoError(t, <-done)
		require.GreaterOrEqual(t, time.Since(start), 10*time.Minute+30*time.Second)

		// A lock nobody keeps alive expires, and the periodic cleanup
		// removes it.
		_, err = c.Locks.Acquire(ctx, "gone", plan1, 10*time.Second)
		require.NoError(t, err)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		all, err := c.Locks.List(ctx, application.ListOptions{IncludeExpired: true})
		require.NoError(t, err)
		require.Empty(t, all, "the periodic cleanup removed the expired lock")
	})
}

func TestSynctest_Memory(t *testing.T) {
	inBubble(t, locks.Config{Database: locks.MemoryDatabase})
}

func TestSynctest_SQLite(t *testing.T) {
	inBubble(t, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db"), PollOnly: true})
}
