package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// TestTakeover_OnTheServersClock: a host whose estimate of the server's
// time runs ahead (a link slower one way than the other moves the midpoint
// of the fastest round trip that postgres.ServerClock keeps) must neither
// take over nor purge a lock that is still active on the server's clock.
// The services' clocks are mocks set from the real time, which is the
// server's: it runs on this machine.
func TestTakeover_OnTheServersClock(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	now := time.Now()
	a := mustService(t, dsn, mockAt(now))
	held, err := a.Acquire(ctx, "A", plan1, time.Minute)
	require.NoError(t, err)
	// A minute and a second ahead: A's lock has expired, by this host's
	// reckoning, and has a minute left on the server.
	b := mustService(t, dsn, mockAt(now.Add(time.Minute+time.Second)))

	_, err = b.Acquire(ctx, "B", plan1, 0)
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict, "Acquire")
	assert.Equal(t, held, conflict.Holder)
	_, err = b.Take(ctx, "B", plan1, application.AcquireOptions{})
	require.ErrorIs(t, err, domain.ErrConflict, "Take")
	n, err := b.CleanupExpired(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "cleanup purged an active lock")

	got, err := a.Get(ctx, plan1)
	require.NoError(t, err)
	assert.Equal(t, held, got, "A still holds its lock, as stored")
}

// TestFence_StoppedHolderDoesNotKeepTheLock: a holder that checked its
// fence and then stopped inside its transaction (SIGSTOP, a cut link: to
// the server, a transaction left idle) holds the lock row FOR KEY SHARE,
// which makes every takeover wait. The check sets the transaction's idle
// timeout to the lock's time left plus a second: the server then ends the
// holder's session and the takeover goes ahead, where it used to wait
// until the server noticed the client gone (hours, with TCP's keepalives).
func TestFence_StoppedHolderDoesNotKeepTheLock(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	now := time.Now() // the server's clock: it runs on this machine
	// Acquired 4.5 s ago with the shortest TTL: half a second left.
	a := mustService(t, dsn, mockAt(now.Add(-4500*time.Millisecond)))
	held, err := a.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)

	raw := rawPG(t, dsn)
	tx, err := raw.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(held), now))
	// A second fence, on a lock with an hour left, keeps the shortest
	// bound (each check used to set its own, the last one winning).
	long, err := a.Acquire(ctx, "A", plan2, time.Hour)
	require.NoError(t, err)
	require.NoError(t, postgres.CheckFence(ctx, tx, application.FenceOf(long), now))
	// The holder stops here: its transaction stays open, idle.

	// B's clock is past the expiry; the server's gets there in half a
	// second, and B tries until then and a little after, each try bounded.
	b := mustService(t, dsn, mockAt(now.Add(5*time.Second)))
	var h *application.Handle
	require.Eventually(t, func() bool {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		h, err = b.Take(tctx, "B", plan1, application.AcquireOptions{})
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "the takeover still waited for the stopped holder's transaction")
	assert.Greater(t, h.Lock().Token, held.Token)
	require.Error(t, tx.Commit(), "the server ended the holder's transaction: its write never lands")
}

// TestUpdate_ChangeOfHandsOnTheServersClock: the store's Update, which
// the service falls back to when the one-statement acquire leaves a case
// to it, must not carry out a change of hands that the host's clock
// decided and the server's clock refuses (an outside review got there:
// the resource was released between the statement and its read, and the
// old holder took it again before the Update). A deliberate replacement
// of an active lock, decided at a now when it was active (a dead
// holder's), is carried out.
func TestUpdate_ChangeOfHandsOnTheServersClock(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	now := time.Now() // the server's clock: it runs on this machine
	a := mustService(t, dsn, mockAt(now))
	held, err := a.Acquire(ctx, "C", plan1, time.Minute)
	require.NoError(t, err)

	db, err := postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	repo := postgres.NewLockRepository(db)
	ahead := now.Add(time.Minute + time.Second) // C's lock has expired by this host's reckoning
	_, err = repo.Update(ctx, plan1, func(cur *domain.Lock) (application.Change, error) {
		return application.DecideAcquire(cur, "B", plan1, ahead, ahead.Add(5*time.Second))
	})
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict, "a change of hands the server's clock refuses")
	assert.Equal(t, held, conflict.Holder)
	got, err := a.Get(ctx, plan1)
	require.NoError(t, err)
	assert.Equal(t, held, got, "C still holds its lock")

	// A replacement decided at a now when the lock was active goes ahead.
	l, err := repo.Update(ctx, plan1, func(cur *domain.Lock) (application.Change, error) {
		return application.DecideAcquire(nil, "D", plan1, now, now.Add(5*time.Second))
	})
	require.NoError(t, err)
	assert.Greater(t, l.Token, held.Token)
}
