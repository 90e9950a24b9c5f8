package planstore_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/planstore"
	"github.com/cleveragents/locks/tests/testdb"
)

const ttl = time.Minute

var (
	plan1    = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-1"}
	project1 = domain.ResourceRef{Type: domain.ResourceProject, ID: "project-1"}
)

// eachDatabase runs fn on a new SQLite file, and on a new PostgreSQL
// schema when the server is configured (skipped otherwise).
func eachDatabase(t *testing.T, fn func(t *testing.T, database string)) {
	t.Run("SQLite", func(t *testing.T) { fn(t, filepath.Join(t.TempDir(), "agents.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { fn(t, testdb.Postgres(t)) })
}

func newMock() *clock.Mock {
	mc := clock.NewMock()
	mc.Set(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	return mc
}

// mustOpen opens a container on database, closed when the test ends.
func mustOpen(t *testing.T, database, owner string, clk application.Clock) *locks.Container {
	t.Helper()
	c, err := locks.Open(context.Background(), locks.Config{Database: database, Owner: owner, Clock: clk, LocalTime: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// mustPlans opens the plan store on database, fenced by c, with plan1 at
// phase "draft".
func mustPlans(t *testing.T, database string, c *locks.Container) *planstore.Store {
	t.Helper()
	ctx := context.Background()
	s, err := planstore.Open(ctx, database, c.CheckFence)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.Create(ctx, planstore.Plan{ID: plan1.ID, Phase: "draft"}))
	return s
}

func mustLoad(t *testing.T, s *planstore.Store, id string) planstore.Plan {
	t.Helper()
	p, err := s.Load(context.Background(), id)
	require.NoError(t, err)
	return p
}

// finished reports whether done is closed, without waiting.
func finished(done <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}
