package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// The one-statement renew (LockRepository.RenewAt) waits for the
// resource's advisory lock like every other write that decides, and
// decides with a now read before that wait.

// A renew whose statement waited until the lock expired must not extend
// it: the holder's lock lapsed, and renewing it would keep its token
// across that moment. The statement leaves it to Update, which reads a
// fresh now and says the lock has expired.
func TestRenew_AfterTheLockExpiredWhileItWaited(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	mc := mockAt(acquireStart)
	var events recorder
	svc := mustService(t, dsn, mc, application.WithObserver(&events))
	first, err := svc.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	mc.Set(first.ExpiresAt.Add(-time.Millisecond))

	_, err = acquireBehind(t, dsn, mc, time.Millisecond+time.Microsecond, func() (domain.Lock, error) {
		return svc.Renew(ctx, "A", plan1, 5*time.Second)
	})
	var ee *domain.LockExpiredError
	require.ErrorAs(t, err, &ee, "the lock expired while the renew waited")
	assert.Equal(t, first.ExpiresAt, ee.ExpiredAt)
	assert.Equal(t, application.EventRenewFailed, events.last().Kind)
	got, err := svc.Get(ctx, plan1)
	require.NoError(t, err)
	assert.Equal(t, first, got, "the lock was not extended")
}

// A renew that waited, but not past the expiry, extends the lock from the
// now it read before the wait: the token and the acquisition time stay.
func TestRenew_WaitedButStillActive(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	mc := mockAt(acquireStart)
	svc := mustService(t, dsn, mc)
	first, err := svc.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	before := mc.Now()

	l, err := acquireBehind(t, dsn, mc, time.Second, func() (domain.Lock, error) {
		return svc.Renew(ctx, "A", plan1, 5*time.Second)
	})
	require.NoError(t, err)
	assert.Equal(t, first.Token, l.Token)
	assert.Equal(t, first.AcquiredAt, l.AcquiredAt)
	assert.Equal(t, before.Add(5*time.Second), l.ExpiresAt, "dated at the now read before the wait")
}
