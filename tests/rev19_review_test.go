package tests

// Adversarial review (rev19). Expected to FAIL: each test shows a promise
// of the handle change that does not hold, through the container.

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// Promise 1: a stale handle never shares another acquisition's token, and
// its fenced write is refused. A Release whose context has already ended
// (a request that was cancelled, `defer h.Release(ctx)`) fails, removes
// nothing, and still frees the handle's slot: the next Take of the same
// owner re-enters the lock in the store and gets the released handle's
// token. The released handle's fence then passes CheckFence while the new
// handle holds the plan: a lost update.
func TestReview19_CancelledReleaseThenTakeSharesTokenAndFence(t *testing.T) {
	run := func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		first, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		ok, rerr := first.Release(ended)
		t.Logf("Release with an ended context: %v, %v", ok, rerr)
		if rerr == nil {
			t.Skip("the store ignored the ended context")
		}
		second, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		defer second.Release(ctx)
		assert.NotEqual(t, first.Lock().Token, second.Lock().Token,
			"the second Take shares the (released) first handle's token")
		assert.Error(t, first.Lost(ctx), "the released first handle says it is not lost while the second holds the plan")
	}
	t.Run("SQLite", func(t *testing.T) {
		c := MustOpen(t, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db"), Owner: "A", Clock: newMock()})
		run(t, c)
		// And the fence: the released handle's write goes through.
		ctx := context.Background()
		require.NoError(t, c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS plans (id TEXT PRIMARY KEY, phase TEXT)`)
			return err
		}))
		first, err := c.Locks.Take(ctx, "A", rvPlan2, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, rerr := first.Release(ended)
		require.Error(t, rerr)
		second, err := c.Locks.Take(ctx, "A", rvPlan2, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		defer second.Release(ctx)
		stale := c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if err := c.CheckFence(ctx, tx, application.FenceOf(first.Lock())); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO plans VALUES ('plan-2', 'stale')`)
			return err
		})
		assert.Error(t, stale, "the released handle's fenced write was accepted while another handle holds the plan")
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		c := MustOpen(t, locks.Config{Database: testdb.Postgres(t), Owner: "A", Clock: newMock(), LocalTime: true})
		run(t, c)
	})
}

var rvPlan2 = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-2"}
