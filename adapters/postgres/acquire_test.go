package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// The one-statement acquire (LockRepository.AcquireAt): what it
// must never write, and what it decides when it waited for another write
// of the resource with a now read before the wait.

var acquireStart = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

// mustService opens a store on dsn (a new pool, so a new contention hint)
// and a service on it at the clock mc. Its sessions carry the name
// waitFor looks for.
func mustService(t *testing.T, dsn string, mc application.Clock, opts ...application.Option) *application.LockService {
	t.Helper()
	db, err := postgres.Open(context.Background(), withParam(t, dsn, "application_name", appName(t)), postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	svc, err := application.NewLockService(postgres.NewLockRepository(db), mc, 0, opts...)
	require.NoError(t, err)
	return svc
}

func mockAt(at time.Time) *clock.Mock {
	mc := clock.NewMock()
	mc.Set(at)
	return mc
}

// A refused acquire writes nothing: it takes no lock on the holder's row
// (ON CONFLICT DO UPDATE ... WHERE false would: xmax set to its
// transaction), makes no new row version (ctid) and draws no token from
// the sequence. Without a write it has no transaction id, so its commit
// flushes no WAL. Each store is new, so that the refusal is decided by
// the statement and not by the read a contended resource gets first; the
// last service is asked again once the hint is set.
func TestAcquire_RefusalWritesNothing(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	mc := mockAt(acquireStart)
	held, err := mustService(t, dsn, mc).Acquire(ctx, "A", plan1, time.Minute)
	require.NoError(t, err)
	raw := rawPG(t, dsn)
	state := func() (s struct {
		xmax, ctid string
		seq        int64
	}) {
		t.Helper()
		require.NoError(t, raw.QueryRow(`SELECT xmax::text, ctid::text,
			pg_sequence_last_value(pg_get_serial_sequence('locks', 'id')::regclass)
			FROM locks WHERE id = $1`, held.Token).Scan(&s.xmax, &s.ctid, &s.seq))
		return s
	}
	before := state()
	require.Equal(t, "0", before.xmax)

	var svc *application.LockService
	for range 3 {
		svc = mustService(t, dsn, mc)
		mc.Add(time.Second)
		_, err := svc.Acquire(ctx, "B", plan1, 0)
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, held, ce.Holder, "the refusal names the holder")
		assert.Equal(t, before, state(), "a refusal decided by the statement wrote nothing")
	}
	_, err = svc.Acquire(ctx, "B", plan1, 0)
	require.ErrorIs(t, err, domain.ErrConflict)
	assert.Equal(t, before, state(), "a refusal decided on the read wrote nothing")
}

// An acquire that waited for a renew of the lock it found expired tests
// the renewed row again and is refused: a renewed lock is never taken
// over. The renew's commit is held open by a deferred trigger that sleeps,
// so the acquire surely queues behind it.
func TestAcquire_SparesALockRenewedWhileItWaited(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	clockA := mockAt(acquireStart)
	svcA := mustService(t, dsn, clockA)
	_, err := svcA.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	admin := rawPG(t, dsn)
	slowCommits(t, admin, 1)

	clockA.Set(acquireStart.Add(4 * time.Second)) // one second before the expiry
	renewed := make(chan error, 1)
	go func() { _, err := svcA.Renew(ctx, "A", plan1, 5*time.Second); renewed <- err }()
	waitFor(t, admin, `wait_event = 'PgSleep'`, "the renew never reached its commit")

	// B's clock runs two seconds ahead: at its now, the lock as it was
	// before the renew has expired.
	_, err = mustService(t, dsn, mockAt(acquireStart.Add(6*time.Second))).Acquire(ctx, "B", plan1, 5*time.Second)
	require.NoError(t, <-renewed, "the renew succeeded")
	var ce *domain.LockConflictError
	require.ErrorAs(t, err, &ce, "the acquire that waited for the renew is refused")
	assert.Equal(t, "A", ce.Holder.Owner)
	assert.Equal(t, acquireStart.Add(9*time.Second), ce.Holder.ExpiresAt, "the holder is the renewed lock")
}

// A re-entry whose statement waited until the caller's own lock expired
// is a change of hands: a new token, not the old one extended. The
// statement, whose now was read before the wait, leaves it undecided, and
// the decision is taken again at a new now.
func TestAcquire_ReentryAfterTheLockExpiredWhileItWaited(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	mc := mockAt(acquireStart)
	var events recorder
	svc := mustService(t, dsn, mc, application.WithObserver(&events))
	first, err := svc.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	mc.Set(first.ExpiresAt.Add(-time.Millisecond))

	l, err := acquireBehind(t, dsn, mc, time.Millisecond+time.Microsecond, func() (domain.Lock, error) {
		return svc.Acquire(ctx, "A", plan1, 5*time.Second)
	})
	require.NoError(t, err)
	assert.Greater(t, l.Token, first.Token, "a new token")
	assert.Equal(t, mc.Now(), l.AcquiredAt, "dated when Update decided")
	last := events.last()
	assert.Equal(t, application.EventTakenOver, last.Kind)
	require.NotNil(t, last.Previous)
	assert.Equal(t, first, *last.Previous)
}

// A lock written after a wait longer than its TTL is dated from before the
// wait: it has expired when the statement returns, and the caller is told
// so, as after a slow commit.
func TestAcquire_WrittenAfterItsTTLIsRefusedAsExpired(t *testing.T) {
	dsn := testdb.Postgres(t)
	mc := mockAt(acquireStart)
	svc := mustService(t, dsn, mc)
	_, err := acquireBehind(t, dsn, mc, 6*time.Second, func() (domain.Lock, error) {
		return svc.Acquire(context.Background(), "A", plan1, 5*time.Second)
	})
	var ee *domain.LockExpiredError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, acquireStart.Add(5*time.Second), ee.ExpiredAt)
	assert.Equal(t, mc.Now(), ee.WrittenAt)
}

// acquireBehind runs acquire while another transaction holds plan1's
// advisory lock, as an Update of it would, moves mc by d once the acquire
// waits for it, and then lets it go on.
func acquireBehind(t *testing.T, dsn string, mc *clock.Mock, d time.Duration, acquire func() (domain.Lock, error)) (domain.Lock, error) {
	t.Helper()
	admin := rawPG(t, dsn)
	tx, err := admin.Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.Exec("SELECT pg_advisory_xact_lock($1)", postgres.ResourceKey(plan1))
	require.NoError(t, err)
	type result struct {
		l   domain.Lock
		err error
	}
	done := make(chan result, 1)
	go func() { l, err := acquire(); done <- result{l, err} }()
	waitFor(t, admin, `wait_event = 'advisory'`, "the acquire never waited for the advisory lock")
	mc.Add(d)
	require.NoError(t, tx.Commit())
	r := <-done
	return r.l, r.err
}

// appName names the sessions of this test's services, apart from those
// of any other test the server runs meanwhile.
// The server keeps 63 bytes of it.
func appName(t *testing.T) string {
	n := fmt.Sprintf("locks-%d-%s", os.Getpid(), t.Name())
	return n[:min(len(n), 63)]
}

// waitFor waits until a session of this test's services matches where.
func waitFor(t *testing.T, admin *sql.DB, where, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND `+where, appName(t)).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 2*time.Millisecond, msg)
}

// recorder keeps the events a service reports.
type recorder struct {
	mu     sync.Mutex
	events []application.Event
}

func (r *recorder) Observe(_ context.Context, e application.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) last() application.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events[len(r.events)-1]
}
