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

// goneProcesses says every process is gone, except those it lists alive,
// and counts its probes.
type goneProcesses struct {
	alive  map[int]bool
	probes int
}

func (g *goneProcesses) Gone(p domain.ProcessOwner) bool { g.probes++; return !g.alive[p.PID] }

type recorder struct{ events []application.Event }

func (r *recorder) Observe(_ context.Context, e application.Event) { r.events = append(r.events, e) }

func TestLockService_DeadHolderTakeover(t *testing.T) {
	ctx := context.Background()
	dead := domain.ProcessOwner{Host: "h", PID: 7, Nonce: "0a1b2c3d",
		BootID: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", PIDNamespace: 1, StartTime: 9}.String()
	setup := func(t *testing.T, holder string, procs *goneProcesses) (*application.LockService, *recorder, domain.Lock) {
		mc := clock.NewMock()
		mc.Set(holdStart)
		rec := &recorder{}
		opts := []application.Option{application.WithObserver(rec)}
		if procs != nil {
			opts = append(opts, application.WithProcesses(procs))
		}
		svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0, opts...)
		require.NoError(t, err)
		held, err := svc.Acquire(ctx, holder, plan, time.Hour)
		require.NoError(t, err)
		return svc, rec, held
	}

	t.Run("GoneProcessIsTakenOverAtOnce", func(t *testing.T) {
		svc, rec, held := setup(t, dead, &goneProcesses{})
		l, err := svc.Acquire(ctx, "B", plan, 0)
		require.NoError(t, err)
		assert.Equal(t, "B", l.Owner)
		assert.Greater(t, l.Token, held.Token)
		last := rec.events[len(rec.events)-1]
		assert.Equal(t, application.EventTakenOver, last.Kind)
		assert.True(t, last.DeadHolder)
		assert.Equal(t, held, *last.Previous, "the event names the previous holder")
	})
	t.Run("LiveProcessIsRefused", func(t *testing.T) {
		svc, _, _ := setup(t, dead, &goneProcesses{alive: map[int]bool{7: true}})
		_, err := svc.Acquire(ctx, "B", plan, 0)
		require.ErrorIs(t, err, domain.ErrConflict)
	})
	t.Run("ExplicitOwnerIsNeverProbed", func(t *testing.T) {
		procs := &goneProcesses{}
		svc, _, _ := setup(t, "alice", procs)
		_, err := svc.Acquire(ctx, "B", plan, 0)
		require.ErrorIs(t, err, domain.ErrConflict)
		assert.Zero(t, procs.probes)
	})
	t.Run("SwitchedOff", func(t *testing.T) {
		svc, _, _ := setup(t, dead, nil)
		_, err := svc.Acquire(ctx, "B", plan, 0)
		require.ErrorIs(t, err, domain.ErrConflict)
	})
}
