package application_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// AcquireWaitResult says what the acquisition was, with no observer and
// whatever the clock shows: a re-entry keeps the token, so only the
// service can tell it from a first acquisition at the same instant.
func TestLockService_AcquireWaitResult(t *testing.T) {
	ctx := context.Background()
	dead := domain.ProcessOwner{Host: "h", PID: 7, Nonce: "0a1b2c3d",
		BootID: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", PIDNamespace: 1, StartTime: 9}.String()
	mc := clock.NewMock()
	mc.Set(holdStart)
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0, application.WithProcesses(&goneProcesses{}))
	require.NoError(t, err)
	opts := application.AcquireOptions{TTL: time.Hour}

	first, err := svc.AcquireWaitResult(ctx, "A", plan, opts)
	require.NoError(t, err)
	assert.False(t, first.Reentered)
	assert.Nil(t, first.TookOverFrom)

	again, err := svc.AcquireWaitResult(ctx, "A", plan, opts)
	require.NoError(t, err)
	assert.True(t, again.Reentered, "the same owner, the same instant: a re-entry")
	assert.Equal(t, first.Lock.Token, again.Lock.Token)

	other := domain.ResourceRef{Type: domain.ResourcePlan, ID: "q"}
	held, err := svc.Acquire(ctx, dead, other, time.Hour)
	require.NoError(t, err)
	took, err := svc.AcquireWaitResult(ctx, "B", other, opts)
	require.NoError(t, err)
	assert.False(t, took.Reentered)
	require.NotNil(t, took.TookOverFrom, "the holder's process is gone")
	assert.Equal(t, held, *took.TookOverFrom)
	assert.Equal(t, "B", took.Lock.Owner)

	_, err = svc.AcquireWaitResult(ctx, "C", other, opts)
	var conflict *domain.LockConflictError
	require.ErrorAs(t, err, &conflict, "B names no process: never taken over early")
}
