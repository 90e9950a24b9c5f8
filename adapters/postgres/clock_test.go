package postgres_test

import (
	"context"
	"database/sql"
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

// hostClock is the clock of a host whose wall clock an administrator, or
// NTP, steps: its wall time is the real one plus step, which the test
// changes at will, while its monotonic clock runs on undisturbed, as a
// kernel's CLOCK_MONOTONIC does through a step.
type hostClock struct {
	mu    sync.Mutex
	step  time.Duration
	start time.Time
}

func newHostClock(step time.Duration) *hostClock {
	return &hostClock{step: step, start: time.Now()}
}

// Now has no monotonic reading: time.Time.Sub of two of them is the
// difference of the (stepped) wall clock.
func (c *hostClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Round(0).Add(c.step)
}

func (c *hostClock) Monotonic() time.Duration { return time.Since(c.start) }

// Step moves the wall clock by d, at once.
func (c *hostClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.step += d
}

// mustOpenWithRaw opens a store on a new schema, and a plain connection
// pool to the same server, to read its clock.
func mustOpenWithRaw(t *testing.T) (*postgres.DB, *sql.DB) {
	t.Helper()
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db, rawPG(t, dsn)
}

// serverNow reads the server's clock.
func serverNow(t *testing.T, raw *sql.DB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, raw.QueryRow("SELECT clock_timestamp()").Scan(&now))
	return now
}

// requireServerTime checks that sc estimates the server's time within its
// uncertainty: sc.Now() is read between two readings of the server's
// clock, so it must lie between them, give or take the uncertainty (and
// a millisecond for the local clock's drift since the measurement). The
// bracket makes the check independent of how long each step takes.
func requireServerTime(t *testing.T, raw *sql.DB, sc *postgres.ServerClock, msg string) {
	t.Helper()
	_, uncertainty, err := sc.Offset()
	require.NoError(t, err)
	bound := uncertainty + time.Millisecond
	before := serverNow(t, raw)
	now := sc.Now()
	after := serverNow(t, raw)
	assert.False(t, now.Before(before.Add(-bound)) || now.After(after.Add(bound)),
		"%s: the host's estimate %s is not within ±%s of the server's time, read as %s then %s",
		msg, now.Format(time.RFC3339Nano), bound, before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano))
}

// A host whose clock runs five minutes ahead of the server's estimates the
// server's time, and reports its own clock as five minutes ahead: the
// offset (the server's time minus the host's) is minus five minutes. The
// server of the test suite runs on this machine, or on one whose clock
// agrees with it within seconds.
func TestServerClock_SkewedHost(t *testing.T) {
	db, raw := mustOpenWithRaw(t)
	const skew = 5 * time.Minute
	sc, err := postgres.NewServerClock(context.Background(), db, newHostClock(skew))
	require.NoError(t, err)
	defer sc.Close()

	requireServerTime(t, raw, sc, "five minutes ahead")
	offset, _, err := sc.Offset()
	require.NoError(t, err)
	assert.InDelta(t, float64(-skew), float64(offset), float64(30*time.Second),
		"the server's time minus the host's, for a host %s ahead: %s", skew, offset)
}

// A step of one host's wall clock (NTP, date -s) after the last
// measurement of its offset changes nothing: the host's decision time
// follows the server's through its monotonic clock. A host stepped 11
// minutes ahead does not take a lock with 10 minutes left on the server,
// and one stepped 11 minutes back does not write a lock that has already
// expired on the server. The next measurement then agrees with the server
// within the documented bound, and reports the step in the offset.
func TestServerClock_WallClockStep(t *testing.T) {
	for _, step := range []time.Duration{11 * time.Minute, -11 * time.Minute} {
		t.Run(step.String(), func(t *testing.T) {
			db, raw := mustOpenWithRaw(t)
			ctx := context.Background()

			steady, err := postgres.NewServerClock(ctx, db, clock.New())
			require.NoError(t, err)
			defer steady.Close()
			host := newHostClock(0)
			stepped, err := postgres.NewServerClock(ctx, db, host)
			require.NoError(t, err)
			defer stepped.Close()
			a, err := application.NewLockService(postgres.NewLockRepository(db), steady, 0)
			require.NoError(t, err)
			b, err := application.NewLockService(postgres.NewLockRepository(db), stepped, 0)
			require.NoError(t, err)

			held, err := a.Acquire(ctx, "A", plan1, 10*time.Minute)
			require.NoError(t, err)
			host.Step(step)
			requireServerTime(t, raw, stepped, "after the step, before a new measurement")

			_, err = b.Acquire(ctx, "B", plan1, 0)
			var conflict *domain.LockConflictError
			require.ErrorAs(t, err, &conflict, "a lock with 10 minutes left on the server is live for a host stepped by %s", step)
			assert.Equal(t, held.Token, conflict.Holder.Token)

			// The stepped host's own lock expires 10 minutes after the
			// server's now: the steady host cannot take it.
			plan2 := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-2"}
			before := serverNow(t, raw)
			mine, err := b.Acquire(ctx, "B", plan2, 10*time.Minute)
			require.NoError(t, err)
			assert.False(t, mine.ExpiresAt.Before(before.Add(10*time.Minute-time.Second)),
				"the stepped host's lock expires at %s, 10 minutes after the server's %s", mine.ExpiresAt, before)
			_, err = a.Acquire(ctx, "A", plan2, 0)
			require.ErrorAs(t, err, &conflict, "the stepped host's lock is live on the server")

			require.NoError(t, postgres.Measure(ctx, stepped))
			requireServerTime(t, raw, stepped, "after the next measurement")
			offset, _, err := stepped.Offset()
			require.NoError(t, err)
			assert.InDelta(t, float64(-step), float64(offset), float64(30*time.Second),
				"the offset reports the host's clock stepped by %s: %s", step, offset)
		})
	}
}

// The production host clock: its monotonic reading advances with real
// time (no sleep happens in between, so by no more than time.Now does),
// and a ServerClock on it estimates the server's time.
func TestServerClock_SystemClock(t *testing.T) {
	db, raw := mustOpenWithRaw(t)
	var host postgres.SystemClock
	start, m0 := time.Now(), host.Monotonic()
	m1, elapsed := host.Monotonic(), time.Since(start)
	assert.GreaterOrEqual(t, m1, m0, "the monotonic reading never decreases")
	assert.LessOrEqual(t, m1-m0, elapsed+time.Millisecond, "it runs at the rate of real time")

	sc, err := postgres.NewServerClock(context.Background(), db, host)
	require.NoError(t, err)
	defer sc.Close()
	requireServerTime(t, raw, sc, "the system clock")
}

// The server read its clock somewhere within the round trip of the
// fastest sample: at its midpoint, give or take half of it. Over a link
// slow the same both ways, the midpoint is right to within the link's
// jitter, so the estimate must be much closer to the server's time than
// the half round trip (which a loopback link makes too small to see): an
// estimate that forgot the half round trip runs a whole one-way delay
// ahead, and one that subtracted it twice. The server's time is read
// directly, past the proxy.
func TestServerClock_HalfTheRoundTripThroughASlowLink(t *testing.T) {
	const delay = 150 * time.Millisecond // each way
	dsn := MigratedDSN(t)
	raw := rawPG(t, dsn)
	ctx := context.Background()
	ro, err := postgres.OpenReadOnly(ctx, newLaggyProxy(t, dsn, delay), postgres.Options{MaxConns: 1})
	require.NoError(t, err)
	t.Cleanup(func() { ro.Close() })
	sc, err := postgres.NewServerClock(ctx, ro, postgres.SystemClock{})
	require.NoError(t, err)
	defer sc.Close()

	_, uncertainty, err := sc.Offset()
	require.NoError(t, err)
	require.GreaterOrEqual(t, uncertainty, delay, "the round trip went through the slow link: the test measures it")
	bound := delay / 2
	before := serverNow(t, raw)
	now := sc.Now()
	after := serverNow(t, raw)
	assert.False(t, now.Before(before.Add(-bound)) || now.After(after.Add(bound)),
		"the estimate %s is off the server's time (read as %s then %s) by more than %s, half the one-way delay %s: "+
			"the half round trip is not accounted for",
		now.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano), bound, delay)
}
