package application_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// A wait for a holder is reported as one event spanning the whole wait,
// so that "why did this agent wait 5 minutes?" has an answer.
func TestLockService_WaitedEvent(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(holdStart)
	rec := &recorder{}
	svc := newHoldService(t, memory.NewLockRepository(), clk, application.WithObserver(rec))
	_, err := svc.Acquire(ctx, "A", plan, time.Hour)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := svc.Take(ctx, "B", plan, application.AcquireOptions{Wait: true, Timeout: 5 * time.Minute})
		done <- err
	}()
	require.Equal(t, 5*time.Minute, clk.NextTimer(t))
	clk.NextTimer(t) // the first poll
	clk.Add(5 * time.Minute)
	require.ErrorIs(t, <-done, domain.ErrConflict)

	last := rec.events[len(rec.events)-1]
	assert.Equal(t, application.EventWaited, last.Kind)
	assert.Equal(t, 5*time.Minute, last.Took, "the whole wait")
	require.ErrorIs(t, last.Err, domain.ErrConflict, "and why it ended without the lock")
}

// A release through a handle names the acquisition it removed, so that an
// observer can tell two acquisitions of one owner apart.
func TestLockService_ReleasedEventNamesTheAcquisition(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(holdStart)
	rec := &recorder{}
	svc := newHoldService(t, memory.NewLockRepository(), clk, application.WithObserver(rec))
	h, err := svc.Take(ctx, "A", plan, application.AcquireOptions{})
	require.NoError(t, err)
	clk.Add(time.Second)
	released, err := h.Release(ctx)
	require.NoError(t, err)
	require.True(t, released)

	last := rec.events[len(rec.events)-1]
	assert.Equal(t, application.EventReleased, last.Kind)
	require.NotNil(t, last.Previous, "the released acquisition")
	assert.Equal(t, h.Lock(), *last.Previous)
	assert.Equal(t, time.Second, last.HeldFor)
}
