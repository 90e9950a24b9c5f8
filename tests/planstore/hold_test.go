package planstore_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/planstore"
)

// stillBlocked is how long a change of hands is watched not to happen
// while a fenced transaction is open: long against a local write (well
// under a millisecond), short against SQLite's busy timeout (5 s).
const stillBlocked = 300 * time.Millisecond

// background runs op in a goroutine; the channel is closed when it
// returns, after its error is stored in *err.
func background(op func() error, err *error) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		*err = op()
	}()
	return done
}

// A fence checked in a transaction keeps its lock from changing hands
// until the transaction ends: a takeover, a cleanup and a release all wait
// for the commit, and then go ahead. Without that, a fenced write could
// commit after another owner took the plan. On PostgreSQL, where the
// transaction holds the lock's row and may run on for long, a takeover
// does not wait: it is refused with a conflict that says a transaction
// holds the row; a cleanup skips the row; both then go ahead once the
// transaction has ended.
func TestCheckFence_HoldsTheLockUntilCommit(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		mc := newMock()
		c := mustOpen(t, database, "A", mc)
		plans := mustPlans(t, database, c)

		// fenced takes A's lock on ref, checks its fence in a new
		// transaction of the plan store, and moves the clock past the
		// lock's expiry.
		fenced := func(ref domain.ResourceRef) (*sql.Tx, domain.Lock) {
			t.Helper()
			a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
			require.NoError(t, err)
			tx, err := plans.DB().BeginTx(ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			require.NoError(t, c.CheckFence(ctx, tx, application.FenceOf(a)))
			mc.Add(2 * ttl)
			return tx, a
		}

		t.Run("takeover", func(t *testing.T) {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: plan1.ID}
			tx, a := fenced(ref)
			var b domain.Lock
			var err error
			if locks.IsPostgres(database) {
				_, err = c.Locks.Acquire(ctx, "B", ref, ttl)
				var conflict *domain.LockConflictError
				require.ErrorAs(t, err, &conflict, "the takeover must not happen before the fenced commit")
				assert.True(t, conflict.RowHeld)
				assert.Equal(t, a.Token, conflict.Holder.Token)
				_, xerr := tx.ExecContext(ctx, "UPDATE plans SET phase = 'fenced' WHERE id = '"+plan1.ID+"'")
				require.NoError(t, xerr)
				require.NoError(t, tx.Commit())
				b, err = c.Locks.Acquire(ctx, "B", ref, ttl)
				require.NoError(t, err)
				assert.Greater(t, b.Token, a.Token)
				assert.Equal(t, "fenced", mustLoad(t, plans, plan1.ID).Phase)
				return
			}
			done := background(func() (err error) { b, err = c.Locks.Acquire(ctx, "B", ref, ttl); return }, &err)
			require.Never(t, finished(done), stillBlocked, 10*time.Millisecond, "the takeover must wait for the fenced commit")
			_, xerr := tx.ExecContext(ctx, "UPDATE plans SET phase = 'fenced' WHERE id = '"+plan1.ID+"'")
			require.NoError(t, xerr)
			require.NoError(t, tx.Commit())
			<-done
			require.NoError(t, err)
			assert.Greater(t, b.Token, a.Token)
			assert.Equal(t, "fenced", mustLoad(t, plans, plan1.ID).Phase)
		})
		t.Run("cleanup", func(t *testing.T) {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "cleaned"}
			tx, a := fenced(ref)
			var n int
			var err error
			if locks.IsPostgres(database) {
				_, err = c.Locks.CleanupExpired(ctx) // the earlier subtests' locks have expired too
				require.NoError(t, err)
				got, err := c.Locks.Get(ctx, ref)
				require.NoError(t, err, "the cleanup skips the row the fenced transaction holds")
				assert.Equal(t, a.Token, got.Token)
				require.NoError(t, tx.Commit())
				n, err = c.Locks.CleanupExpired(ctx)
				require.NoError(t, err)
				assert.Positive(t, n)
				return
			}
			done := background(func() (err error) { n, err = c.Locks.CleanupExpired(ctx); return }, &err)
			require.Never(t, finished(done), stillBlocked, 10*time.Millisecond, "the cleanup must wait for the fenced commit")
			require.NoError(t, tx.Commit())
			<-done
			require.NoError(t, err)
			assert.Positive(t, n)
		})
		t.Run("release", func(t *testing.T) {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "released"}
			tx, _ := fenced(ref)
			var ok bool
			var err error
			done := background(func() (err error) { ok, err = c.Locks.Release(ctx, "A", ref); return }, &err)
			require.Never(t, finished(done), stillBlocked, 10*time.Millisecond, "the release must wait for the fenced commit")
			require.NoError(t, tx.Commit())
			<-done
			require.NoError(t, err)
			assert.True(t, ok)
		})
	})
}

// On PostgreSQL the fence locks the row FOR KEY SHARE, which does not
// conflict with the holder's renewal (an UPDATE of expires_at alone): a
// transition whose persist is slow does not stop its own keep-alive.
// SQLite has a single writer, so there the renewal waits for the commit
// like every other write.
func TestCheckFence_RenewalDuringFencedTransaction(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		mc := newMock()
		c := mustOpen(t, database, "A", mc)
		plans := mustPlans(t, database, c)

		a, err := c.Locks.Acquire(ctx, "A", plan1, ttl)
		require.NoError(t, err)
		tx, err := plans.DB().BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		require.NoError(t, c.CheckFence(ctx, tx, application.FenceOf(a)))
		mc.Add(ttl / 2)

		var renewed domain.Lock
		done := background(func() (err error) { renewed, err = c.Locks.Renew(ctx, "A", plan1, ttl); return }, &err)
		if locks.IsPostgres(database) {
			require.Eventually(t, finished(done), 5*time.Second, time.Millisecond, "the renewal must not wait for the fenced transaction")
		} else {
			require.Never(t, finished(done), stillBlocked, 10*time.Millisecond, "SQLite: the renewal waits for the write lock")
		}
		require.NoError(t, tx.Commit())
		<-done
		require.NoError(t, err)
		assert.Equal(t, a.Token, renewed.Token)
		assert.Equal(t, a.ExpiresAt.Add(ttl/2), renewed.ExpiresAt)
	})
}

// deferredDSN is the lock store's SQLite DSN with deferred transactions,
// which take the write lock only at their first write.
func deferredDSN(t *testing.T, database string) string {
	t.Helper()
	u, err := url.Parse("file:" + database)
	require.NoError(t, err)
	q := u.Query()
	q.Set("_journal_mode", "WAL")
	q.Set("_busy_timeout", "5000")
	q.Set("_txlock", "deferred")
	return "file:" + database + "?" + q.Encode()
}

// An embedder's SQLite connection may begin deferred transactions. The
// fence's UPDATE then takes the write lock, so it holds the lock until the
// commit as well. A deferred transaction that read before the fence works
// on a snapshot that a change of hands may have outdated: SQLite refuses
// it the write lock (SQLITE_BUSY_SNAPSHOT), so the fence never succeeds
// on what the transaction read: Container.CheckFence reads the lock
// outside the transaction, and a lock taken over meanwhile is the
// LockLostError naming the new holder, a lock renewed meanwhile (held) a
// busy StaleSnapshotError.
func TestCheckFence_SQLiteDeferredTransaction(t *testing.T) {
	ctx := context.Background()
	database := t.TempDir() + "/agents.db"
	mc := newMock()
	c := mustOpen(t, database, "A", mc)
	mustPlans(t, database, c)
	db, err := sql.Open("sqlite", deferredDSN(t, database))
	require.NoError(t, err)
	defer db.Close()
	plans := planstore.New(db, dialect.SQLite, c.CheckFence)

	t.Run("fence first", func(t *testing.T) {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "first"}
		a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
		require.NoError(t, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		require.NoError(t, c.CheckFence(ctx, tx, application.FenceOf(a)))
		mc.Add(2 * ttl)
		done := background(func() error { _, err := c.Locks.Acquire(ctx, "B", ref, ttl); return err }, &err)
		require.Never(t, finished(done), stillBlocked, 10*time.Millisecond, "the takeover must wait for the fenced commit")
		require.NoError(t, tx.Commit())
		<-done
		require.NoError(t, err)
	})

	t.Run("read, then a takeover", func(t *testing.T) {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "read-taken"}
		a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
		require.NoError(t, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		var phase string
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT phase FROM plans WHERE id = ?", plan1.ID).Scan(&phase))
		mc.Add(2 * ttl)
		_, err = c.Locks.Acquire(ctx, "B", ref, ttl)
		require.NoError(t, err)
		err = c.CheckFence(ctx, tx, application.FenceOf(a))
		require.Error(t, err, "a fence checked on an outdated snapshot must never hold")
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost, "the lock is B's now: %v", err)
		assert.ErrorIs(t, err, domain.ErrExpired)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		require.NotNil(t, lost.NewHolder, "%v", err)
		assert.Equal(t, "B", lost.NewHolder.Owner)
	})

	t.Run("read, then a renewal", func(t *testing.T) {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "read-renewed"}
		a, err := c.Locks.Acquire(ctx, "A", ref, ttl)
		require.NoError(t, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		var phase string
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT phase FROM plans WHERE id = ?", plan1.ID).Scan(&phase))
		_, err = c.Locks.Renew(ctx, "A", ref, ttl)
		require.NoError(t, err)
		err = c.CheckFence(ctx, tx, application.FenceOf(a))
		require.ErrorIs(t, err, domain.ErrUnavailable)
		assert.True(t, domain.IsStoreKind(err, domain.StoreBusy), "%v", err)
		require.NoError(t, tx.Rollback())

		// Started again, the transaction sees the renewed lock.
		require.NoError(t, plans.Persist(ctx, plan1.ID, planstore.Plan{Phase: "again"}, []application.Fence{application.FenceOf(a)}))
	})
}
