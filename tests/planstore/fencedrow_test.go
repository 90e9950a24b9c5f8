package planstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// promptly bounds what the tests below wait for an answer that must not
// wait for a fenced transaction: generous for a loaded machine, and far
// shorter than the transaction, which runs until the test ends it.
const promptly = 10 * time.Second

// A holder whose fenced transaction runs on past its lock's expiry keeps
// the lock's row locked (FOR KEY SHARE) until it ends: the lock cannot
// change hands meanwhile (docs/lifecycle.md). Nothing else may wait for
// that transaction: a new container's Open, whose startup cleanup used to
// wait on the row for as long as the transaction ran (14.6 s of a 20 s
// run, found by an outside review), skips the row and returns; a
// non-waiting Acquire of the resource, which used to wait until its
// context ended (context deadline exceeded), is refused at once with a
// conflict that names the holder and says its transaction still runs; a
// waiting one waits, and gets the lock once the transaction has ended.
func TestFencedTransactionPastItsExpiry(t *testing.T) {
	database := testdb.Postgres(t)
	ctx := context.Background()
	mc := newMock()
	a := mustOpen(t, database, "A", mc)
	plans := mustPlans(t, database, a)

	held, err := a.Locks.Acquire(ctx, "A", plan1, ttl)
	require.NoError(t, err)
	tx, err := plans.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // ended below; a failed test rolls back
	require.NoError(t, a.CheckFence(ctx, tx, application.FenceOf(held)))
	mc.Add(2 * ttl) // the lock expires while the transaction goes on

	// A new container opens, and its startup cleanup leaves the row alone.
	openCtx, cancel := context.WithTimeout(ctx, promptly)
	defer cancel()
	b, err := locks.Open(openCtx, locks.Config{Database: database, Owner: "B", Clock: mc, LocalTime: true})
	require.NoError(t, err, "Open must not wait for the fenced transaction")
	t.Cleanup(func() { _ = b.Close() })

	// A non-waiting acquire is refused promptly, naming the holder.
	acqCtx, cancel := context.WithTimeout(ctx, promptly)
	defer cancel()
	_, err = b.Locks.Acquire(acqCtx, "B", plan1, ttl)
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict, "got %v", err)
	assert.ErrorIs(t, err, domain.ErrConflict)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, held.Token, conflict.Holder.Token)
	assert.Equal(t, "A", conflict.Holder.Owner)
	assert.Contains(t, err.Error(), "transaction")

	// Take, the handle's acquire, says the same.
	_, err = b.Locks.Take(acqCtx, "B", plan1, application.AcquireOptions{TTL: ttl})
	require.ErrorAs(t, err, &conflict, "got %v", err)
	assert.Equal(t, held.Token, conflict.Holder.Token)

	// A waiting acquire waits for the transaction, and gets the lock once
	// it has ended.
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 4*promptly)
		defer cancel()
		h, err := b.Locks.Take(wctx, "B", plan1, application.AcquireOptions{TTL: ttl, Wait: true})
		if err == nil {
			_, err = h.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		require.FailNow(t, "the wait ended while the fenced transaction ran", "%v", err)
	case <-time.After(time.Second):
	}
	require.NoError(t, tx.Rollback())
	// The wait looks again after a pause on the container's clock, which
	// the test moves.
	gaveUp := time.After(4 * promptly)
	for {
		select {
		case err := <-got:
			require.NoError(t, err)
			return
		case <-gaveUp:
			require.FailNow(t, "the wait never got the lock")
		case <-time.After(20 * time.Millisecond):
			mc.Add(100 * time.Millisecond)
		}
	}
}
