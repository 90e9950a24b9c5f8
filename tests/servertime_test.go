package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// skewedClock is the real clock of a host whose time is off by skew.
type skewedClock struct{ skew time.Duration }

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }

// Two hosts whose clocks run two minutes ahead of and behind real time
// share locks on one PostgreSQL server: both decide on the server's time,
// so neither takes the other's live lock early, and a lock's expiry is
// now+TTL of the server's clock, within the measured uncertainty.
func TestPostgres_ServerTimeAcrossSkewedHosts(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	ahead := MustOpen(t, locks.Config{Database: dsn, Owner: "ahead", Clock: skewedClock{2 * time.Minute}})
	behind := MustOpen(t, locks.Config{Database: dsn, Owner: "behind", Clock: skewedClock{-2 * time.Minute}})

	// The bound: what each host's estimate may be off by. The server runs
	// on this machine, so its clock is time.Now's.
	bound := func(c *locks.Container) time.Duration {
		sc, ok := c.Clock().(*postgres.ServerClock)
		require.True(t, ok, "a PostgreSQL container decides on server time")
		_, uncertainty, err := sc.Offset()
		require.NoError(t, err)
		return uncertainty + 20*time.Millisecond // scheduling between the two readings
	}
	for _, c := range []*locks.Container{ahead, behind} {
		diff := c.Locks.Now().Sub(time.Now())
		assert.Less(t, diff.Abs(), bound(c), "%s decides at server time, off by %s", c.Owner(), diff)
	}

	held, err := behind.Locks.Acquire(ctx, "behind", plan1, 5*time.Second)
	require.NoError(t, err)
	assert.Less(t, held.ExpiresAt.Sub(time.Now().Add(5*time.Second)).Abs(), bound(behind),
		"expires 5 s after the server's now, not after the host's")

	// Two minutes ahead, the lock would already have expired on local time.
	_, err = ahead.Locks.Acquire(ctx, "ahead", plan1, 0)
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict, "the host whose clock runs ahead does not take the live lock")
	assert.Equal(t, held.Token, conflict.Holder.Token)

	// Renewals from the host behind are not refused as expired either.
	_, err = behind.Locks.Renew(ctx, "behind", plan1, 5*time.Second)
	require.NoError(t, err)

	// And the local-time switch really decides on the host's clock: the
	// host ahead would take the lock at once.
	local := MustOpen(t, locks.Config{Database: dsn, Owner: "local", Clock: skewedClock{2 * time.Minute}, LocalTime: true, SkipStartupCleanup: true})
	_, err = local.Locks.Acquire(ctx, "local", plan1, 0)
	require.NoError(t, err, "with LocalTime, a clock two minutes ahead sees the lock expired")
}
