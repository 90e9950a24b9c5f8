package planstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/planstore"
	"github.com/cleveragents/locks/tests/testdb"
)

// A PostgreSQL transaction above READ COMMITTED reads one snapshot, taken
// at its first statement. A fence checked after an earlier read cannot
// see a lock acquired or renewed since: it must not hold, and the error
// must not call the lock lost while it is held. It says the snapshot is
// older than the lock (a busy store: retry, at READ COMMITTED or with the
// fence first). A lock that really is lost is reported as lost, as it is
// now, not as the snapshot had it. At READ COMMITTED the same fences hold.
func TestCheckFence_PostgresSnapshotIsolation(t *testing.T) {
	database := testdb.Postgres(t)
	ctx := context.Background()
	mc := newMock()
	c := mustOpen(t, database, "A", mc)
	plans := mustPlans(t, database, c)
	n := 0
	// begin starts a transaction at level and reads a plan in it, which
	// takes its snapshot.
	begin := func(t *testing.T, level sql.IsolationLevel) *sql.Tx {
		t.Helper()
		tx, err := plans.DB().BeginTx(ctx, &sql.TxOptions{Isolation: level})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback() })
		var phase string
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT phase FROM plans WHERE id = $1", plan1.ID).Scan(&phase))
		return tx
	}
	newRef := func() domain.ResourceRef {
		n++
		return domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("snapshot-", n)}
	}
	// requireHeldButStale checks the error of a fence that is held, seen
	// from an older snapshot.
	requireHeldButStale := func(t *testing.T, level sql.IsolationLevel, err error) {
		t.Helper()
		if level == sql.LevelReadCommitted {
			require.NoError(t, err, "at READ COMMITTED the fence reads the lock as committed now")
			return
		}
		require.Error(t, err, "a fence checked on an older snapshot must never hold")
		assert.NotErrorIs(t, err, domain.ErrExpired, "the lock is held: %v", err)
		assert.True(t, domain.IsStoreKind(err, domain.StoreBusy), "a retry resolves it: %v", err)
		var stale *domain.StaleSnapshotError
		require.ErrorAs(t, err, &stale, "the error says the snapshot is old")
		assert.True(t, stale.Held, "the lock was read outside the transaction and is held: %v", err)
		assert.Equal(t, strings.ToUpper(level.String()), stale.Isolation)
		t.Log(err)
	}

	for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			t.Run("acquired after the snapshot", func(t *testing.T) {
				ref := newRef()
				tx := begin(t, level)
				a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
				require.NoError(t, err)
				requireHeldButStale(t, level, c.CheckFence(ctx, tx, application.FenceOf(a)))
			})

			t.Run("renewed after the snapshot, past its old expiry", func(t *testing.T) {
				ref := newRef()
				a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
				require.NoError(t, err)
				tx := begin(t, level)
				mc.Add(ttl / 2)
				_, err = c.Locks.Renew(ctx, "A", ref, ttl)
				require.NoError(t, err)
				mc.Add(ttl / 2)
				requireHeldButStale(t, level, c.CheckFence(ctx, tx, application.FenceOf(a)))
			})

			t.Run("renewed after the snapshot, before its old expiry", func(t *testing.T) {
				ref := newRef()
				a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
				require.NoError(t, err)
				tx := begin(t, level)
				_, err = c.Locks.Renew(ctx, "A", ref, ttl)
				require.NoError(t, err)
				err = c.CheckFence(ctx, tx, application.FenceOf(a))
				if err != nil { // the snapshot's row is unexpired: PostgreSQL may let the check lock it
					requireHeldButStale(t, level, err)
				} else {
					t.Log("the fence held")
				}
			})

			t.Run("taken over after the snapshot", func(t *testing.T) {
				ref := newRef()
				a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
				require.NoError(t, err)
				tx := begin(t, level)
				mc.Add(2 * ttl)
				b, err := c.Locks.Acquire(ctx, "B", ref, ttl)
				require.NoError(t, err)
				requireTakenOver(t, c.CheckFence(ctx, tx, application.FenceOf(a)), a, b)
			})

			t.Run("released after the snapshot", func(t *testing.T) {
				ref := newRef()
				a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
				require.NoError(t, err)
				tx := begin(t, level)
				_, err = c.Locks.Release(ctx, "A", ref)
				require.NoError(t, err)
				err = c.CheckFence(ctx, tx, application.FenceOf(a))
				var lost *domain.LockLostError
				require.ErrorAs(t, err, &lost, "the lock is gone")
				assert.Equal(t, domain.LostExpired, lost.Reason)
				assert.Nil(t, lost.NewHolder)
			})

			t.Run("checked by entstore alone", func(t *testing.T) {
				// Without the container, nothing reads the lock outside
				// the transaction: the snapshot cannot tell whether a lock
				// acquired since is held, unless it shows a newer one.
				ref := newRef()
				tx := begin(t, level)
				a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
				require.NoError(t, err)
				err = postgres.CheckFence(ctx, tx, application.FenceOf(a), c.Locks.Now())
				if level == sql.LevelReadCommitted {
					require.NoError(t, err)
					return
				}
				var stale *domain.StaleSnapshotError
				require.ErrorAs(t, err, &stale, "%v", err)
				assert.False(t, stale.Held, "the lock may be held: %v", err)
				assert.NotErrorIs(t, err, domain.ErrExpired)

				old := newRef()
				a, err = c.Locks.Acquire(ctx, "A", old, ttl)
				require.NoError(t, err)
				mc.Add(2 * ttl)
				b, err := c.Locks.Acquire(ctx, "B", old, ttl)
				require.NoError(t, err)
				tx = begin(t, level)
				err = postgres.CheckFence(ctx, tx, application.FenceOf(a), c.Locks.Now())
				requireTakenOver(t, err, a, b)
			})

			t.Run("retried with the fence first", func(t *testing.T) {
				ref := newRef()
				a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
				require.NoError(t, err)
				tx, err := plans.DB().BeginTx(ctx, &sql.TxOptions{Isolation: level})
				require.NoError(t, err)
				defer tx.Rollback()
				require.NoError(t, c.CheckFence(ctx, tx, application.FenceOf(a)))
			})
		})
	}
}

// A SQLite deferred transaction that read before the fence, on a database
// another connection has written since (a renewal of the very lock), is
// refused the write lock at once (SQLITE_BUSY_SNAPSHOT): no wait helps,
// since the transaction's own snapshot is out of date, not the database
// busy. The error says so and that the transaction should begin with
// BEGIN IMMEDIATE (sqlite.DSN's _txlock=immediate), and is still a busy
// store to errors.As. Begun so, the same work passes.
func TestCheckFence_SQLiteStaleSnapshot(t *testing.T) {
	ctx := context.Background()
	database := t.TempDir() + "/agents.db"
	c := mustOpen(t, database, "A", newMock())
	mustPlans(t, database, c)
	deferred, err := sql.Open("sqlite", deferredDSN(t, database))
	require.NoError(t, err)
	defer deferred.Close()

	a, err := c.Locks.Acquire(ctx, "A", plan1, ttl)
	require.NoError(t, err)
	tx, err := deferred.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	var phase string
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT phase FROM plans WHERE id = ?", plan1.ID).Scan(&phase))
	_, err = c.Locks.Renew(ctx, "A", plan1, ttl)
	require.NoError(t, err)

	err = c.CheckFence(ctx, tx, application.FenceOf(a))
	require.Error(t, err, "a fence checked on an outdated snapshot must never hold")
	assert.True(t, domain.IsStoreKind(err, domain.StoreBusy), "%v", err)
	assert.NotErrorIs(t, err, domain.ErrExpired)
	var stale *domain.StaleSnapshotError
	require.ErrorAs(t, err, &stale, "the error names the stale snapshot: %v", err)
	assert.Contains(t, err.Error(), "BEGIN IMMEDIATE", "it says how to begin the transaction")
	assert.Contains(t, err.Error(), "_txlock=immediate")
	assert.NotContains(t, err.Error(), "long write transaction", "no other writer is to blame")
	t.Log(err)
	require.NoError(t, tx.Rollback())

	dsn, err := sqlite.DSN(database, 5*time.Second)
	require.NoError(t, err)
	immediate, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	defer immediate.Close()
	plans := planstore.New(immediate, dialect.SQLite, c.CheckFence)
	require.NoError(t, plans.Persist(ctx, plan1.ID, planstore.Plan{Phase: "immediate"}, []application.Fence{application.FenceOf(a)}))
}
