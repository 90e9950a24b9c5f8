package postgres_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/tests/testdb"
)

// idleBound reads, inside tx, the idle timeout the fence checks have set
// for the rest of it.
func idleBound(t *testing.T, tx *sql.Tx) time.Duration {
	t.Helper()
	var ms string
	require.NoError(t, tx.QueryRow("SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'").Scan(&ms))
	n, err := strconv.ParseInt(ms, 10, 64)
	require.NoError(t, err)
	return time.Duration(n) * time.Millisecond
}

// TestFence_CheckAgainAfterRenewalExtendsTheIdleBound: a fenced
// transaction may idle for its lock's time left plus a second; checking
// the fence again after a renewal extends that bound to the new expiry
// (docs/lifecycle.md), where the first check's bound used to stay, so
// that the server ended a transaction whose lock had most of a minute
// left. The fence's now is given, so the lock's time left is whatever the
// test says: no waiting for an expiry. The transaction then idles for
// longer than the first bound, and goes on.
func TestFence_CheckAgainAfterRenewalExtendsTheIdleBound(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	now := time.Now() // the server's clock: it runs on this machine
	a := mustService(t, dsn, mockAt(now))
	held, err := a.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)

	raw := rawPG(t, dsn)
	tx, err := raw.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	// Checked with half a second left: the bound is a second and a half.
	require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(held), held.ExpiresAt.Add(-500*time.Millisecond)))
	assert.InDelta(t, 1500*time.Millisecond, idleBound(t, tx), float64(10*time.Millisecond), "the first check's bound")

	renewed, err := a.Renew(ctx, "A", plan1, time.Minute)
	require.NoError(t, err)
	require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(renewed), now))
	assert.InDelta(t, time.Minute+time.Second, idleBound(t, tx), float64(time.Second), "the check after the renewal extends the bound")

	// Idle past the first bound: the server must not end the transaction.
	time.Sleep(2 * time.Second)
	var one int
	require.NoError(t, tx.QueryRow("SELECT 1").Scan(&one), "the server ended a transaction whose lock has most of a minute left")
	require.NoError(t, tx.Commit())
}

// TestFence_ExtendedIdleBoundKeepsTheShortest: extending the bound of one
// fence leaves it no longer than the other fences of the transaction
// allow, as last checked, nor than the transaction's own idle timeout
// from before its first fence.
func TestFence_ExtendedIdleBoundKeepsTheShortest(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	now := time.Now()
	a := mustService(t, dsn, mockAt(now))
	short, err := a.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	long, err := a.Acquire(ctx, "A", plan2, 30*time.Second)
	require.NoError(t, err)
	raw := rawPG(t, dsn)

	t.Run("other fences", func(t *testing.T) {
		tx, err := raw.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(short), now))
		require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(long), now))
		assert.InDelta(t, 6*time.Second, idleBound(t, tx), float64(time.Second), "the shortest fence's bound")
		renewed, err := a.Renew(ctx, "A", plan1, time.Hour)
		require.NoError(t, err)
		require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(renewed), now))
		assert.InDelta(t, 31*time.Second, idleBound(t, tx), float64(time.Second), "bounded by the other fence")
		// Checked later, the other fence's bound is shorter by the time gone.
		require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(renewed), now.Add(10*time.Second)))
		assert.InDelta(t, 21*time.Second, idleBound(t, tx), float64(time.Second), "the other fence's time left, at the later now")
	})
	t.Run("own timeout", func(t *testing.T) {
		tx, err := raw.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		_, err = tx.Exec("SET LOCAL idle_in_transaction_session_timeout = '10s'")
		require.NoError(t, err)
		require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(long), now))
		assert.Equal(t, 10*time.Second, idleBound(t, tx), "the transaction's own, shorter timeout")
		renewed, err := a.Renew(ctx, "A", plan2, time.Hour)
		require.NoError(t, err)
		require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(renewed), now))
		assert.Equal(t, 10*time.Second, idleBound(t, tx), "still the transaction's own timeout")
	})
}
