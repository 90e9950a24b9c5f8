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

// unlockedWithin is how long a call may take, on a loaded machine, on a
// store that is not held by anyone: past it, the store is taken to be
// stuck.
const unlockedWithin = 5 * time.Second

// testRepository holds the port itself to its promises, without the
// service in front: a new caller of LockRepository (a second service, a
// tool) relies on them as much as LockService does.
func testRepository(t *testing.T, newRepo NewRepository) {
	ctx := context.Background()
	insert := insertDecide

	run(t, "DecideErrorUnchanged", func(t *testing.T) {
		repo := newRepo(t)
		mine := errors.New("the caller's own reason")
		conflict := &domain.LockConflictError{Holder: domain.Lock{Owner: "B", Resource: plan1}}
		for _, want := range []error{mine, conflict, mine} {
			_, err := repo.Update(ctx, plan1, func(*domain.Lock) (application.Change, error) { return application.Change{}, want })
			require.True(t, err == want, "Update returns Decide's error itself, got %T: %v", err, err)
		}
	})

	run(t, "DecidePanicRollsBack", func(t *testing.T) {
		repo := newRepo(t)
		func() {
			defer func() { require.Equal(t, "decide failed", recover(), "the panic goes on to the caller") }()
			_, _ = repo.Update(ctx, plan1, func(*domain.Lock) (application.Change, error) { panic("decide failed") })
		}()
		// The transaction (or mutex) the panic left must be gone: a store
		// that kept it would keep every later call waiting, forever. The
		// calls run in a goroutine, so that such a store fails here, in
		// seconds, rather than at go test's timeout.
		type result struct {
			l   domain.Lock
			ok  bool
			err error
		}
		done := make(chan result, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, unlockedWithin)
			defer cancel()
			l, err := repo.Update(wctx, plan1, insert("A", Start, Start.Add(time.Minute)))
			if err != nil {
				done <- result{err: err}
				return
			}
			ok, err := repo.DeleteOwned(wctx, plan1, "A")
			done <- result{l, ok, err}
		}()
		select {
		case r := <-done:
			require.NoError(t, r.err, "the resource is writable after a panic in Decide")
			assert.True(t, r.ok, "lock %d released", r.l.Token)
		case <-time.After(unlockedWithin):
			t.Fatalf("the store stays locked after Decide panicked: an Update and a DeleteOwned "+
				"of the resource have not returned in %s", unlockedWithin)
		}
	})

	run(t, "ExtendSetsTheExpiryGiven", func(t *testing.T) {
		repo := newRepo(t)
		l, err := repo.Update(ctx, plan1, insert("A", Start, Start.Add(time.Hour)))
		require.NoError(t, err)
		for _, expires := range []time.Time{Start.Add(time.Minute), Start.Add(2 * time.Hour), Start.Add(time.Second)} {
			got, err := repo.Update(ctx, plan1, func(*domain.Lock) (application.Change, error) {
				return application.Change{Kind: application.ChangeExtend, Lock: domain.Lock{ExpiresAt: expires}}, nil
			})
			require.NoError(t, err)
			want := l
			want.ExpiresAt = expires
			assert.Equal(t, want, got, "ChangeExtend sets the expiry given, earlier or later than the current one")
			stored, err := repo.Get(ctx, plan1)
			require.NoError(t, err)
			assert.Equal(t, want, stored, "ChangeExtend stores the expiry given, earlier or later than the current one")
		}
	})

	run(t, "ChangeNoneReturnsTheLock", func(t *testing.T) {
		// A Decide that changes nothing gets the lock as stored back,
		// active or expired, and the store is left as it was: a caller
		// that reads through Update (to decide under the write's
		// exclusion) relies on the answer.
		repo := newRepo(t)
		none := func(saw **domain.Lock) application.Decide {
			return func(cur *domain.Lock) (application.Change, error) {
				*saw = cur
				return application.Change{}, nil
			}
		}
		var saw *domain.Lock
		got, err := repo.Update(ctx, plan1, none(&saw))
		require.NoError(t, err)
		assert.Nil(t, saw, "Decide is given nil for a resource with no lock")
		assert.Equal(t, domain.Lock{}, got, "Update with ChangeNone returns the zero Lock when there was none")
		_, err = repo.Get(ctx, plan1)
		require.ErrorIs(t, err, domain.ErrNotFound, "Update with ChangeNone wrote a lock")

		held, err := repo.Update(ctx, plan1, insert("A", Start, Start.Add(time.Minute)))
		require.NoError(t, err)
		expired, err := repo.Update(ctx, plan2, insert("B", Start.Add(-time.Hour), Start.Add(-time.Second)))
		require.NoError(t, err)
		for _, l := range []domain.Lock{held, expired} {
			got, err := repo.Update(ctx, l.Resource, none(&saw))
			require.NoError(t, err)
			if assert.NotNil(t, saw, "Decide is given the lock on %s", l.Resource) {
				assert.Equal(t, l, *saw, "Decide is given the lock on %s as stored", l.Resource)
			}
			assert.Equal(t, l, got, "Update with ChangeNone returns the lock on %s unchanged, as stored", l.Resource)
			stored, err := repo.Get(ctx, l.Resource)
			require.NoError(t, err)
			assert.Equal(t, l, stored, "Update with ChangeNone leaves the lock on %s as it was", l.Resource)
		}
		next, err := repo.Update(ctx, project1, insert("C", Start, Start.Add(time.Minute)))
		require.NoError(t, err)
		assert.Greater(t, next.Token, expired.Token, "the next token is still greater than every earlier one")
	})

	run(t, "DeleteExpiredAtMostLimit", func(t *testing.T) {
		repo := newRepo(t)
		const expired = 5
		for i := range expired {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "expired-" + itoa(i)}
			_, err := repo.Update(ctx, ref, insert("A", Start.Add(-time.Hour), Start.Add(-time.Duration(i+1)*time.Second)))
			require.NoError(t, err)
		}
		active, err := repo.Update(ctx, plan1, insert("A", Start, Start.Add(time.Minute)))
		require.NoError(t, err)
		for _, step := range []struct{ limit, removed, left int }{{2, 2, 3}, {1, 1, 2}, {2, 2, 0}, {2, 0, 0}} {
			n, err := repo.DeleteExpired(ctx, Start, step.limit)
			require.NoError(t, err)
			require.Equal(t, step.removed, n, "DeleteExpired removes at most limit (%d) locks, and fewer only when no more have expired", step.limit)
			left, err := repo.CountExpired(ctx, Start)
			require.NoError(t, err)
			require.Equal(t, step.left, left, "expired locks left after DeleteExpired(limit %d)", step.limit)
		}
		all, err := repo.List(ctx, application.ListFilter{})
		require.NoError(t, err)
		assert.Equal(t, []domain.Lock{active}, all, "the active lock is kept")
	})

	run(t, "EndedContextWritesNothing", func(t *testing.T) { testRepositoryEndedContext(t, newRepo) })

	run(t, "ReturnsWhatItStored", func(t *testing.T) {
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

	run(t, "ContextEndedMidWrite", func(t *testing.T) {
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

	run(t, "ListInByteOrder", func(t *testing.T) {
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
