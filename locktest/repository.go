package locktest

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// testRepository holds the port itself to its promises, without the
// service in front: a new caller of LockRepository (a second service, a
// tool) relies on them as much as LockService does.
func testRepository(t *testing.T, newRepo NewRepository) {
	ctx := context.Background()
	insert := func(owner string, acquired, expires time.Time) application.Decide {
		return func(*domain.Lock) (application.Change, error) {
			return application.Change{Kind: application.ChangeInsert, Lock: domain.Lock{
				Owner: owner, AcquiredAt: acquired, ExpiresAt: expires}}, nil
		}
	}

	t.Run("DecideErrorUnchanged", func(t *testing.T) {
		repo := newRepo(t)
		mine := errors.New("the caller's own reason")
		conflict := &domain.LockConflictError{Holder: domain.Lock{Owner: "B", Resource: plan1}}
		for _, want := range []error{mine, conflict, mine} {
			_, err := repo.Update(ctx, plan1, func(*domain.Lock) (application.Change, error) { return application.Change{}, want })
			require.True(t, err == want, "Update returns Decide's error itself, got %T: %v", err, err)
		}
	})

	t.Run("DecidePanicRollsBack", func(t *testing.T) {
		repo := newRepo(t)
		func() {
			defer func() { require.Equal(t, "decide failed", recover(), "the panic goes on to the caller") }()
			_, _ = repo.Update(ctx, plan1, func(*domain.Lock) (application.Change, error) { panic("decide failed") })
		}()
		// The transaction the panic left must be gone: a store that kept it
		// open would keep every later write of the resource waiting.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := repo.Update(wctx, plan1, insert("A", Start, Start.Add(time.Minute)))
		require.NoError(t, err, "the resource is writable after a panic in Decide")
		ok, err := repo.DeleteOwned(wctx, plan1, "A")
		require.NoError(t, err)
		assert.True(t, ok, "lock %d released", l.Token)
	})

	t.Run("ReturnsWhatItStored", func(t *testing.T) {
		repo := newRepo(t)
		// Nanoseconds, and another zone: more than any store keeps.
		zone := time.FixedZone("UTC+1", 3600)
		acquired := Start.Add(789 * time.Nanosecond).In(zone)
		expires := Start.Add(time.Minute + 999*time.Nanosecond).In(zone)
		got, err := repo.Update(ctx, plan1, insert("A", acquired, expires))
		require.NoError(t, err)
		stored, err := repo.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, stored, got, "Update returns the lock as stored")
		assert.Equal(t, time.UTC, got.ExpiresAt.Location())

		// At an instant between the expiry as given and the expiry as
		// stored, the returned lock and the store must agree.
		at := Start.Add(time.Minute + 500*time.Nanosecond)
		n, err := repo.CountExpired(ctx, at)
		require.NoError(t, err)
		assert.Equal(t, got.ExpiredAt(at), n == 1, "the returned lock and the store disagree at %s", at)

		extended, err := repo.Update(ctx, plan1, func(*domain.Lock) (application.Change, error) {
			return application.Change{Kind: application.ChangeExtend, Lock: domain.Lock{ExpiresAt: expires.Add(time.Minute)}}, nil
		})
		require.NoError(t, err)
		stored, err = repo.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, stored, extended, "an extended lock is returned as stored")
	})

	t.Run("ContextEndedMidWrite", func(t *testing.T) {
		// The caller's context ends while its write is under way, at
		// various points: the answer is the context's error (or success,
		// if the write was done), never a store failure.
		repo := newRepo(t)
		for i := range 200 {
			cctx, cancel := context.WithCancel(ctx)
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: itoa(i)}
			_, err := repo.Update(cctx, ref, func(*domain.Lock) (application.Change, error) {
				cancel()
				for range i % 4 {
					runtime.Gosched() // let database/sql notice, sometimes
				}
				if i%2 == 0 {
					return application.Change{}, nil
				}
				return application.Change{Kind: application.ChangeInsert, Lock: domain.Lock{
					Owner: "A", AcquiredAt: Start, ExpiresAt: Start.Add(time.Minute)}}, nil
			})
			cancel()
			if err == nil {
				continue
			}
			require.ErrorIs(t, err, context.Canceled, "round %d", i)
			require.NotErrorIs(t, err, domain.ErrUnavailable, "round %d: a cancelled call is not a store failure", i)
			_, gerr := repo.Get(ctx, ref)
			require.ErrorIs(t, gerr, domain.ErrNotFound, "round %d: a cancelled write wrote nothing", i)
		}
	})

	t.Run("ListInByteOrder", func(t *testing.T) {
		repo := newRepo(t)
		ids := []string{"a1", "Zeta", "_x", "a-2", "B", "a"}
		for _, id := range ids {
			_, err := repo.Update(ctx, domain.ResourceRef{Type: domain.ResourcePlan, ID: id}, insert("A", Start, Start.Add(time.Minute)))
			require.NoError(t, err)
		}
		all, err := repo.List(ctx, application.ListFilter{})
		require.NoError(t, err)
		var got []string
		for _, l := range all {
			got = append(got, l.Resource.ID)
		}
		assert.Equal(t, []string{"B", "Zeta", "_x", "a", "a-2", "a1"}, got)
	})
}
