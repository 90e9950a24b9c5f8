package locktest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// testExactBytes holds a store to owners and resource ids that are exact
// byte strings: a store that compares them with a collation that folds
// case, ignores trailing spaces or normalises Unicode lets one owner
// release another's lock, or two owners share one lock.
func testExactBytes(t *testing.T, newRepo NewRepository) {
	run(t, "OwnersAreExactBytes", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		// Each holder, and the owners that must not be taken for it.
		cases := []struct {
			holder string
			ref    domain.ResourceRef
			others []string
		}{
			{"alice", plan1, []string{"Alice", "ALICE", "alice ", "alic"}},
			{"worker-12", plan2, []string{"worker-1", "worker-123", "Worker-12"}},
			{"caf\u00e9", project1, []string{"cafe\u0301", "CAF\u00c9"}}, // NFC; NFD and upper case
		}
		var held []domain.Lock
		for _, c := range cases {
			held = append(held, f.MustAcquire(t, c.holder, c.ref, time.Minute))
		}
		for _, c := range cases {
			for _, other := range c.others {
				_, err := f.Svc.Acquire(f.Ctx, other, c.ref, 0)
				assert.ErrorIs(t, err, domain.ErrConflict, "%q re-entered %q's lock on %s", other, c.holder, c.ref)
				_, err = f.Svc.Renew(f.Ctx, other, c.ref, 0)
				assert.ErrorIs(t, err, domain.ErrConflict, "%q renewed %q's lock on %s", other, c.holder, c.ref)
				mine, err := f.Svc.List(f.Ctx, application.ListOptions{Owner: other, IncludeExpired: true})
				require.NoError(t, err)
				assert.Empty(t, mine, "List of %q's locks shows %q's", other, c.holder)
				// The releases last, and the first wrong one ends the
				// check: what follows it would only repeat it.
				ok, err := f.Svc.Release(f.Ctx, other, c.ref)
				require.NoError(t, err)
				require.False(t, ok, "%q released %q's lock on %s", other, c.holder, c.ref)
				n, err := f.Svc.ReleaseAllForOwner(f.Ctx, other)
				require.NoError(t, err)
				require.Zero(t, n, "ReleaseAllForOwner(%q) released %q's locks", other, c.holder)
			}
		}
		assert.Equal(t, held, f.All(t), "every lock is still its holder's")
	})

	run(t, "ResourceIDsAreExactBytes", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		pairs := [][2]string{
			{"Deploy", "deploy"},
			{"p1", "p1 "},
			{"caf\u00e9", "cafe\u0301"}, // NFC and NFD
		}
		var all []domain.Lock
		for _, p := range pairs {
			a := domain.ResourceRef{Type: domain.ResourcePlan, ID: p[0]}
			b := domain.ResourceRef{Type: domain.ResourcePlan, ID: p[1]}
			la := f.MustAcquire(t, "A", a, time.Minute)
			lb, err := f.Svc.Acquire(f.Ctx, "B", b, time.Minute)
			require.NoError(t, err, "%s and %s are different resources", a, b)
			assert.Equal(t, b, lb.Resource)
			assert.NotEqual(t, la.Token, lb.Token, "two resources, two acquisitions")
			got, err := f.Svc.Get(f.Ctx, a)
			require.NoError(t, err)
			assert.Equal(t, la, got, "Get(%s) returns its own lock", a)
			ok, err := f.Svc.Release(f.Ctx, "A", b)
			require.NoError(t, err)
			assert.False(t, ok, "A's Release of %s removed a lock: A holds %s only", b, a)
			got, err = f.Svc.Get(f.Ctx, b)
			require.NoError(t, err)
			assert.Equal(t, lb, got, "Get(%s) returns its own lock", b)
			all = append(all, la, lb)
		}
		list := f.All(t)
		assert.Len(t, list, len(all), "every resource has a lock of its own")
		for _, l := range all {
			assert.Contains(t, list, l)
		}
	})
}
