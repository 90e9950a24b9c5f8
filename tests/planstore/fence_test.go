package planstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/planstore"
)

// CheckFence takes what both an Ent transaction and database/sql's
// transaction are: an Ent Tx generated with the sql/execquery feature
// runs ExecContext and QueryContext on its *entsql.Tx.
var (
	_ locks.Querier = (*sql.Tx)(nil)
	_ locks.Querier = (*entsql.Tx)(nil)
)

// A holder paused past its expiry, whose plan another owner took over,
// wakes and writes through its own *sql.Tx: the fence refuses, names the
// new holder, and nothing is written.
func TestCheckFence_PausedHolderIsRefused(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		mc := newMock()
		c := mustOpen(t, database, "A", mc)
		plans := mustPlans(t, database, c)
		before := mustLoad(t, plans, plan1.ID)

		a, err := c.Locks.Acquire(ctx, "A", plan1, ttl)
		require.NoError(t, err)
		mc.Add(2 * ttl) // A is paused past its expiry
		b, err := c.Locks.Acquire(ctx, "B", plan1, ttl)
		require.NoError(t, err)
		require.Greater(t, b.Token, a.Token)

		// The fence itself, from a plain *sql.Tx.
		tx, err := plans.DB().BeginTx(ctx, nil)
		require.NoError(t, err)
		err = c.CheckFence(ctx, tx, application.FenceOf(a))
		require.NoError(t, tx.Rollback())
		requireTakenOver(t, err, a, b)

		// A's fenced write, as its plan store makes it.
		err = plans.Persist(ctx, plan1.ID, planstore.Plan{ID: plan1.ID, Phase: "stale", Counter: 99}, []application.Fence{application.FenceOf(a)})
		requireTakenOver(t, err, a, b)
		assert.Equal(t, before, mustLoad(t, plans, plan1.ID), "a refused write must write nothing")

		// The new holder's write goes through.
		next := planstore.Plan{ID: plan1.ID, Phase: "execute", Counter: 1}
		require.NoError(t, plans.Persist(ctx, plan1.ID, next, []application.Fence{application.FenceOf(b)}))
		next.Token = b.Token
		assert.Equal(t, next, mustLoad(t, plans, plan1.ID))
	})
}

func requireTakenOver(t *testing.T, err error, stale, holder domain.Lock) {
	t.Helper()
	var lost *domain.LockLostError
	require.ErrorAs(t, err, &lost)
	require.ErrorIs(t, err, domain.ErrExpired)
	assert.Equal(t, domain.LostTakenOver, lost.Reason)
	require.NotNil(t, lost.NewHolder)
	assert.Equal(t, holder, *lost.NewHolder)
	assert.Equal(t, stale.Token, lost.Lock.Token)
	assert.Equal(t, stale.Owner, lost.Lock.Owner)
	assert.Contains(t, err.Error(), `owner "`+holder.Owner+`" took it over`)
	assert.NotContains(t, err.Error(), "0001-01-01", "an unknown expiry is not a zero time")
}

// A lock that expired, but that nobody took, no longer fences: the
// expiry is read on the container's clock, with the service's rule (held
// while now < expires_at). A lock cleaned up or released is gone too.
func TestCheckFence_Expired(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		mc := newMock()
		c := mustOpen(t, database, "A", mc)
		plans := mustPlans(t, database, c)
		check := func(f application.Fence) error {
			tx, err := plans.DB().BeginTx(ctx, nil)
			require.NoError(t, err)
			defer tx.Rollback()
			return c.CheckFence(ctx, tx, f)
		}
		requireExpired := func(err error) *domain.LockLostError {
			t.Helper()
			var lost *domain.LockLostError
			require.ErrorAs(t, err, &lost)
			assert.Equal(t, domain.LostExpired, lost.Reason, err.Error())
			assert.Nil(t, lost.NewHolder)
			return lost
		}

		a, err := c.Locks.Acquire(ctx, "A", plan1, ttl)
		require.NoError(t, err)
		mc.Add(ttl - application.Precision)
		require.NoError(t, check(application.FenceOf(a)), "held until the last microsecond")
		mc.Add(application.Precision)
		lost := requireExpired(check(application.FenceOf(a)))
		assert.Equal(t, a, lost.Lock, "the expired lock, as stored")

		n, err := c.Locks.CleanupExpired(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		requireExpired(check(application.FenceOf(a)))

		a, err = c.Locks.Acquire(ctx, "A", plan1, ttl)
		require.NoError(t, err)
		_, err = c.Locks.Release(ctx, "A", plan1)
		require.NoError(t, err)
		requireExpired(check(application.FenceOf(a)))
	})
}

// A transition that changes the project too is fenced by both locks: one
// that does not hold refuses the whole write.
func TestCheckFence_EveryFenceMustHold(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		mc := newMock()
		c := mustOpen(t, database, "A", mc)
		plans := mustPlans(t, database, c)

		proj, err := c.Locks.Acquire(ctx, "A", project1, ttl)
		require.NoError(t, err)
		mc.Add(ttl / 2)
		pl, err := c.Locks.Acquire(ctx, "A", plan1, ttl)
		require.NoError(t, err)
		fences := []application.Fence{application.FenceOf(proj), application.FenceOf(pl)}

		require.NoError(t, plans.Persist(ctx, plan1.ID, planstore.Plan{Phase: "one", Counter: 1}, fences))
		assert.Equal(t, planstore.Plan{ID: plan1.ID, Phase: "one", Counter: 1, Token: pl.Token}, mustLoad(t, plans, plan1.ID))

		mc.Add(ttl / 2) // the project lock expires, the plan lock does not
		other, err := c.Locks.Acquire(ctx, "B", project1, ttl)
		require.NoError(t, err)
		err = plans.Persist(ctx, plan1.ID, planstore.Plan{Phase: "two", Counter: 2}, fences)
		requireTakenOver(t, err, proj, other)
		assert.Equal(t, "one", mustLoad(t, plans, plan1.ID).Phase, "nothing written")
	})
}

// Ent users fence from their transaction: an Ent Tx generated with the
// sql/execquery feature delegates ExecContext and QueryContext to the
// *entsql.Tx it wraps, which is what this test passes.
func TestCheckFence_EntTransaction(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		ctx := context.Background()
		mc := newMock()
		c := mustOpen(t, database, "A", mc)
		plans := mustPlans(t, database, c)
		name := dialect.SQLite
		if locks.IsPostgres(database) {
			name = dialect.Postgres
		}
		drv := entsql.OpenDB(name, plans.DB())

		a, err := c.Locks.Acquire(ctx, "A", plan1, ttl)
		require.NoError(t, err)
		tx, err := drv.BeginTx(ctx, nil)
		require.NoError(t, err)
		etx := tx.(*entsql.Tx)
		require.NoError(t, c.CheckFence(ctx, etx, application.FenceOf(a)))
		require.NoError(t, etx.Commit())

		mc.Add(2 * ttl)
		b, err := c.Locks.Acquire(ctx, "B", plan1, ttl)
		require.NoError(t, err)
		tx, err = drv.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		requireTakenOver(t, c.CheckFence(ctx, tx.(*entsql.Tx), application.FenceOf(a)), a, b)
	})
}

func TestCheckFence_BadInput(t *testing.T) {
	ctx := context.Background()
	database := t.TempDir() + "/agents.db"
	c := mustOpen(t, database, "A", newMock())
	plans := mustPlans(t, database, c)
	tx, err := plans.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	for name, f := range map[string]application.Fence{
		"zero token": {Resource: plan1, Owner: "A"},
		"no owner":   {Resource: plan1, Token: 1},
		"bad type":   {Resource: domain.ResourceRef{Type: "file", ID: "x"}, Owner: "A", Token: 1},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, c.CheckFence(ctx, tx, f), domain.ErrValidation)
		})
	}

	t.Run("memory database", func(t *testing.T) {
		mem := mustOpen(t, locks.MemoryDatabase, "A", newMock())
		err := mem.CheckFence(ctx, tx, application.Fence{Resource: plan1, Owner: "A", Token: 1})
		require.ErrorIs(t, err, domain.ErrUnavailable)
		assert.Contains(t, err.Error(), "not in a SQL database")
	})

	t.Run("ended context", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		err := c.CheckFence(cctx, tx, application.Fence{Resource: plan1, Owner: "A", Token: 1})
		require.ErrorIs(t, err, context.Canceled)
		assert.False(t, errors.Is(err, domain.ErrExpired), "an interrupted check is not a lost lock")
	})
}
