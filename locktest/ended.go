package locktest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// endedContexts are contexts that have ended before the call they are
// given to: one cancelled, one past its deadline.
func endedContexts() map[string]context.Context {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	late, cancelLate := context.WithDeadline(context.Background(), time.Unix(0, 0))
	cancelLate() // ended already; its error stays DeadlineExceeded
	return map[string]context.Context{"Cancelled": cancelled, "PastDeadline": late}
}

// requireEnded checks that err is ctx's own error, not a store failure.
func requireEnded(t *testing.T, ctx context.Context, err error, call string) {
	t.Helper()
	require.ErrorIs(t, err, ctx.Err(), "%s with an ended context returns the context's error", call)
	require.NotErrorIs(t, err, domain.ErrUnavailable, "%s: an ended context is not a store failure", call)
}

// testEndedContext holds the service's writes, over the store, to a
// context that has ended before the call: the context's error, and
// nothing written. Each call goes through whatever the store implements
// (Update, or a OneStatement store's Apply).
func testEndedContext(t *testing.T, newRepo NewRepository) {
	for name, ctx := range endedContexts() {
		run(t, name, func(t *testing.T) {
			f := mustFixture(t, newRepo)
			f.MustAcquire(t, "A", plan1, time.Minute)
			f.MustAcquire(t, "B", plan2, 5*time.Second)
			h, err := f.Svc.Take(f.Ctx, "H", project1, application.AcquireOptions{TTL: time.Minute})
			require.NoError(t, err)
			f.Clock.Add(10 * time.Second) // B's lock has expired, unpurged
			before := f.All(t)
			free := domain.ResourceRef{Type: domain.ResourceProject, ID: "free"}

			for _, c := range []struct {
				call string
				do   func() error
			}{
				{"Acquire of a free resource", func() error { _, err := f.Svc.Acquire(ctx, "C", free, 0); return err }},
				{"Acquire over an expired lock", func() error { _, err := f.Svc.Acquire(ctx, "C", plan2, 0); return err }},
				{"Acquire re-entering", func() error { _, err := f.Svc.Acquire(ctx, "A", plan1, time.Hour); return err }},
				{"Take", func() error {
					_, err := f.Svc.Take(ctx, "C", free, application.AcquireOptions{TTL: time.Minute})
					return err
				}},
				{"Renew", func() error { _, err := f.Svc.Renew(ctx, "A", plan1, time.Hour); return err }},
				{"Handle.Renew", func() error { _, err := h.Renew(ctx); return err }},
				{"Release", func() error {
					ok, err := f.Svc.Release(ctx, "A", plan1)
					assert.False(t, ok, "Release with an ended context reports a removal")
					return err
				}},
				{"ReleaseAllForOwner", func() error {
					n, err := f.Svc.ReleaseAllForOwner(ctx, "A")
					assert.Zero(t, n, "ReleaseAllForOwner with an ended context reports removals")
					return err
				}},
				{"CleanupExpired", func() error {
					n, err := f.Svc.CleanupExpired(ctx)
					assert.Zero(t, n, "CleanupExpired with an ended context reports removals")
					return err
				}},
			} {
				requireEnded(t, ctx, c.do(), c.call)
				assert.Equal(t, before, f.All(t), "%s with an ended context wrote nothing", c.call)
			}
		})
	}
}

// testRepositoryEndedContext holds the port's writes to a context that
// has ended before the call: the context's error, and nothing written.
func testRepositoryEndedContext(t *testing.T, newRepo NewRepository) {
	for name, ctx := range endedContexts() {
		run(t, name, func(t *testing.T) {
			repo := newRepo(t)
			bg := t.Context()
			held, err := repo.Update(bg, plan1, insertDecide("A", Start, Start.Add(time.Minute)))
			require.NoError(t, err)
			_, err = repo.Update(bg, plan2, insertDecide("B", Start.Add(-time.Minute), Start.Add(-time.Second)))
			require.NoError(t, err)
			before, err := repo.List(bg, application.ListFilter{})
			require.NoError(t, err)

			for _, c := range []struct {
				call string
				do   func() error
			}{
				{"Update inserting", func() error {
					_, err := repo.Update(ctx, project1, insertDecide("C", Start, Start.Add(time.Minute)))
					return err
				}},
				{"Update replacing", func() error {
					_, err := repo.Update(ctx, plan2, insertDecide("C", Start, Start.Add(time.Minute)))
					return err
				}},
				{"Update extending", func() error {
					_, err := repo.Update(ctx, plan1, func(*domain.Lock) (application.Change, error) {
						return application.Change{Kind: application.ChangeExtend, Lock: domain.Lock{ExpiresAt: Start.Add(time.Hour)}}, nil
					})
					return err
				}},
				{"DeleteOwned", func() error {
					ok, err := repo.DeleteOwned(ctx, plan1, "A")
					assert.False(t, ok, "DeleteOwned with an ended context reports a removal")
					return err
				}},
				{"DeleteToken", func() error {
					ok, err := repo.DeleteToken(ctx, plan1, held.Token, Start)
					assert.False(t, ok, "DeleteToken with an ended context reports a removal")
					return err
				}},
				{"DeleteAllOwned", func() error {
					n, err := repo.DeleteAllOwned(ctx, "A")
					assert.Zero(t, n, "DeleteAllOwned with an ended context reports removals")
					return err
				}},
				{"DeleteExpired", func() error {
					n, err := repo.DeleteExpired(ctx, Start, 100)
					assert.Zero(t, n, "DeleteExpired with an ended context reports removals")
					return err
				}},
			} {
				requireEnded(t, ctx, c.do(), c.call)
				after, err := repo.List(bg, application.ListFilter{})
				require.NoError(t, err)
				assert.Equal(t, before, after, "%s with an ended context wrote nothing", c.call)
			}
		})
	}
}

// insertDecide is a Decide function that stores a new lock of owner.
func insertDecide(owner string, acquired, expires time.Time) application.Decide {
	return func(*domain.Lock) (application.Change, error) {
		return application.Change{Kind: application.ChangeInsert, Lock: domain.Lock{
			Owner: owner, AcquiredAt: acquired, ExpiresAt: expires}}, nil
	}
}
