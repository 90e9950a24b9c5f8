package tests

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

// A Release whose context has already ended (a cancelled request,
// `defer h.Release(ctx)`) fails and leaves the handle unreleased: a Take
// of the same owner, from this container or another process given the
// same owner id, is refused while the lock is stored; the retried release
// removes it; the next Take gets a token of its own, and the first
// handle's fenced write is refused (SQLite and PostgreSQL).
func TestHandle_CancelledReleaseIsRetriedNeverShared(t *testing.T) {
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
		// The release did not happen: the first handle still holds the
		// plan, here and in the store, and a Take is refused.
		_, err = c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.ErrorIs(t, err, domain.ErrConflict, "a Take while the failed release left the lock held")
		require.NoError(t, first.Lost(ctx), "the first handle still holds its lock")
		ok, rerr = first.Release(ctx) // the retry
		require.NoError(t, rerr)
		require.True(t, ok, "the retried release removes the lock")
		second, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		defer second.Release(ctx)
		assert.NotEqual(t, first.Lock().Token, second.Lock().Token,
			"the second Take shares the (released) first handle's token")
		assert.Error(t, first.Lost(ctx), "the released first handle says it is not lost while the second holds the plan")
	}
	t.Run("SQLite", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "agents.db")
		c := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: newMock()})
		run(t, c)
		// And the fence: the released handle's write goes through.
		ctx := context.Background()
		require.NoError(t, c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS plans (id TEXT PRIMARY KEY, phase TEXT)`)
			return err
		}))
		first, err := c.Locks.Take(ctx, "A", plan2, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, rerr := first.Release(ended)
		require.Error(t, rerr)
		// Another process given the same owner id (its own container, so
		// no handle of its own holds the plan), which only one that
		// shares it, as the agents CLI does, can be: the store refuses it too.
		other := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: newMock(), ShareOwner: true, KeepLocksOnClose: true})
		_, err = other.Locks.Take(ctx, "A", plan2, application.AcquireOptions{TTL: time.Minute})
		require.ErrorIs(t, err, domain.ErrConflict, "the store gave the same owner's Take the lock that the failed release left")
		_, rerr = first.Release(ctx)
		require.NoError(t, rerr)
		second, err := c.Locks.Take(ctx, "A", plan2, application.AcquireOptions{TTL: time.Minute})
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

var plan2 = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-2"}

// On a real store too, a re-entered handle's Renew with a shorter TTL
// never shortens the outer lock: another process is still refused, and
// the outer handle still holds it (SQLite and PostgreSQL).
func TestHandle_ReentrantRenewNeverShortensOnAStore(t *testing.T) {
	run := func(t *testing.T, db string) {
		ctx := context.Background()
		mc := newMock()
		cA := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: mc, LocalTime: true})
		cB := MustOpen(t, locks.Config{Database: db, Owner: "B", Clock: mc, LocalTime: true})
		outer, err := cA.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		held := outer.KeepAlive(ctx)
		defer outer.Release(ctx)
		inner, err := cA.Locks.Take(held, "A", plan1, application.AcquireOptions{TTL: 5 * time.Second, Reentrant: true})
		require.NoError(t, err)
		_, err = inner.Renew(ctx)
		require.NoError(t, err)
		_, _ = inner.Release(ctx)
		mc.Add(10 * time.Second)
		other, err := cB.Locks.Take(ctx, "B", plan1, application.AcquireOptions{})
		if err == nil {
			defer other.Release(ctx)
			select {
			case <-held.Done():
			default:
				t.Errorf("B holds plan-1 (token %d) while A's outer keep-alive context is live (A.Err()=%v)", other.Lock().Token, outer.Err())
			}
			t.Logf("A's Lost: %v", outer.Lost(ctx))
		}
		require.ErrorIs(t, err, domain.ErrConflict, "B took the plan: the re-entry shortened the outer lock")
		require.NoError(t, outer.Lost(ctx))
		require.NoError(t, held.Err())
	}
	t.Run("SQLite", func(t *testing.T) { run(t, filepath.Join(t.TempDir(), "agents.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { run(t, testdb.Postgres(t)) })
}
