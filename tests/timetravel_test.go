package tests

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
	"github.com/cleveragents/locks/tests/testdb"
)

// waitThenTravel is the embedder's time-travel test of the issue that the
// exported test clock answers: another owner holds the plan for 30s, the
// README's runPlan waits for it (Do with Wait), the test waits until the
// service says the waiter waits (Waiting == 1) and moves the clock 31s:
// the waiter must take the lock, with no other wait and no sleep. Before
// Waiting counted only a parked waiter, a move between the waiter's
// queueing and its timer was lost, and the run hung.
func waitThenTravel(t *testing.T, cfg locks.Config) {
	t.Helper()
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	cfg.Clock, cfg.Owner = clk, "me"
	c := MustOpen(t, cfg)
	_, err := c.Locks.Acquire(ctx, "other", plan1, 30*time.Second)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		done <- c.Locks.Do(ctx, c.Owner(), plan1, application.AcquireOptions{Wait: true, Timeout: time.Minute},
			func(context.Context, domain.Lock) error { return nil })
	}()
	for deadline := time.Now().Add(10 * time.Second); c.Locks.Waiting(plan1) != 1; {
		require.True(t, time.Now().Before(deadline), "the waiter never said it waits")
		runtime.Gosched() // look again at once: a test asks as soon as it can
	}
	clk.Add(31 * time.Second)
	select {
	case err := <-done:
		require.NoError(t, err, "the wait ends with the lock taken once the holder expired")
	case <-time.After(10 * time.Second):
		t.Fatalf("hung: the waiter did not see the clock move 31s past the holder's expiry (timers pending: %v)", clk.PendingIn())
	}
}

func TestTimeTravel_WaitingThenMove(t *testing.T) {
	t.Run("memory", func(t *testing.T) { waitThenTravel(t, locks.Config{Database: locks.MemoryDatabase}) })
	t.Run("sqlite", func(t *testing.T) {
		waitThenTravel(t, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db")})
	})
	t.Run("postgres", func(t *testing.T) {
		if os.Getenv("LOCKS_TEST_POSTGRES_DSN") == "" {
			t.Skip("LOCKS_TEST_POSTGRES_DSN is not set")
		}
		waitThenTravel(t, locks.Config{Database: testdb.Postgres(t)})
	})
}
