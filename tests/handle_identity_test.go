package tests

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// The tests of this file hold a Handle to what it is: one acquisition,
// identified by its token (issue 19). Each runs on memory, a SQLite file
// and PostgreSQL (when LOCKS_TEST_POSTGRES_DSN is set), through the
// container as an embedder opens it, on a mock clock that never moves
// unless the test says so: no keep-alive renews behind the test's back.

// eachStore runs fn on a container of each store, owner "A".
func eachStore(t *testing.T, fn func(t *testing.T, c *locks.Container)) {
	open := func(t *testing.T, db string) *locks.Container {
		return MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: newMock(), LocalTime: true})
	}
	t.Run("Memory", func(t *testing.T) { fn(t, open(t, locks.MemoryDatabase)) })
	t.Run("SQLite", func(t *testing.T) { fn(t, open(t, filepath.Join(t.TempDir(), "agents.db"))) })
	t.Run("PostgreSQL", func(t *testing.T) { fn(t, open(t, testdb.Postgres(t))) })
}

// within returns what ch delivers, or fails the test if nothing comes: a
// guard against a call that never returns, not a timed assertion.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer", what)
		var zero T
		return zero
	}
}

// Item 1: a lock lost while fn ran, whether the keep-alive noticed or
// not, is returned by Do; and Do releases nothing that is not its own.
func TestHandle_DoReturnsEveryLoss(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachStore(t, func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		var taker domain.Lock
		err := c.Locks.Do(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute},
			func(context.Context, domain.Lock) error {
				// Behind the holder's back: an operator removes its lock and
				// another owner takes the plan. The keep-alive hears of the
				// removal (or not yet) and ends the work's context: the
				// operator's calls are not the work's.
				_, err := c.Locks.Release(ctx, "A", plan1)
				require.NoError(t, err)
				taker, err = c.Locks.Acquire(ctx, "B", plan1, time.Minute)
				require.NoError(t, err)
				return nil
			})
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost, "Do must report the loss, got %v", err)
		if lost.Reason != domain.LostRemoved { // removed: heard before the takeover
			assert.Equal(t, domain.LostTakenOver, lost.Reason)
			require.NotNil(t, lost.NewHolder)
			assert.Equal(t, taker.Token, lost.NewHolder.Token)
		}
		got, err := c.Locks.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, taker, got, "Do released nothing of B's")
	})
}

// Item 2: a stale handle never adopts the token of a newer acquisition of
// the same owner, neither by Renew nor through its keep-alive.
func TestHandle_NeverAdoptsAnotherToken(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachStore(t, func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		h, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		first := h.Lock()
		_, err = c.Locks.Release(ctx, "A", plan1) // removed behind its back
		require.NoError(t, err)
		b, err := c.Locks.Acquire(ctx, "B", plan1, time.Minute)
		require.NoError(t, err)
		_, err = c.Locks.Release(ctx, "B", plan1)
		require.NoError(t, err)
		again, err := c.Locks.Acquire(ctx, "A", plan1, time.Minute) // a new acquisition of A's
		require.NoError(t, err)
		require.Greater(t, again.Token, b.Token)

		_, err = h.Renew(ctx)
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost, "the stale handle's renewal is a loss, got %v", err)
		assert.Equal(t, first.Token, h.Lock().Token, "the handle keeps its own token")
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		require.NotNil(t, lost.NewHolder)
		assert.Equal(t, again.Token, lost.NewHolder.Token)

		_, err = h.Release(ctx)
		require.ErrorAs(t, err, &lost, "a release that removes nothing is the loss it is, got %v", err)
		got, err := c.Locks.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, again, got, "the stale handle's release leaves A's new lock alone")
	})
}

// Item 2, through the keep-alive: its renewal must be a loss too.
func TestHandle_KeepAliveNeverAdoptsAnotherToken(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachStore(t, func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		mc := c.Clock().(interface{ Add(time.Duration) })
		h, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		defer h.Release(ctx)
		first := h.Lock()
		_, err = c.Locks.Release(ctx, "A", plan1)
		require.NoError(t, err)
		again, err := c.Locks.Acquire(ctx, "A", plan1, time.Minute)
		require.NoError(t, err)
		held := h.KeepAlive(ctx)
		// Time passes a second at a time (the keep-alive's timer may start
		// late) past the renewal at half the TTL, but never up to the
		// expiry of either lock: the renewal must then find A's new token
		// and lose, however long the store takes to answer.
		for i := 0; i < 55 && held.Err() == nil; i++ {
			mc.Add(time.Second)
			select {
			case <-held.Done():
			case <-time.After(time.Millisecond):
			}
		}
		select {
		case <-held.Done():
		case <-time.After(30 * time.Second):
		}
		require.Error(t, held.Err(), "the keep-alive renewed a lock that is not its own")
		var lost *domain.LockLostError
		require.ErrorAs(t, context.Cause(held), &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		assert.Equal(t, first.Token, h.Lock().Token, "the keep-alive never adopts token %d", again.Token)
		got, err := c.Locks.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, again.Token, got.Token)
	})
}

// Item 3: two handles of one container on one resource are never held at
// once, even with the same owner (the README's c.Owner()).
func TestHandle_HandlesOfOneProcessExclude(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachStore(t, func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		first, err := c.Locks.Take(ctx, c.Owner(), plan1, application.AcquireOptions{})
		require.NoError(t, err)

		_, err = c.Locks.Take(ctx, c.Owner(), plan1, application.AcquireOptions{})
		require.ErrorIs(t, err, domain.ErrConflict, "a second handle of the same owner is refused")
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, first.Lock().Token, ce.Holder.Token)
		assert.True(t, ce.InProcess, "the holder is a handle of this process")
		assert.Contains(t, err.Error(), "another handle of this process")

		got := make(chan *application.Handle, 1)
		go func() {
			h, err := c.Locks.Take(ctx, c.Owner(), plan1, application.AcquireOptions{Wait: true})
			assert.NoError(t, err)
			got <- h
		}()
		require.Eventually(t, func() bool { return c.Locks.Waiting(plan1) == 1 }, 10*time.Second, time.Millisecond)
		select {
		case <-got:
			t.Fatal("the second handle was granted while the first held the lock")
		default:
		}
		ok, err := first.Release(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
		second := within(t, got, "the waiting Take")
		require.NotNil(t, second)
		assert.Greater(t, second.Lock().Token, first.Lock().Token, "the second handle is a new acquisition")
		_, err = first.Release(ctx)
		require.NoError(t, err, "releasing twice is harmless")
		stored, err := c.Locks.Get(ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, second.Lock().Token, stored.Token, "the first handle's release left the second's lock")
		ok, err = second.Release(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
	})
}

// Item 4: a nested Take(Wait) of the lock its caller holds (inside Do)
// never queues behind another waiter for that same lock.
func TestHandle_NestedTakeNeverWaitsForItself(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachStore(t, func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		waiter := make(chan error, 1)
		err := c.Locks.Do(ctx, "A", plan1, application.AcquireOptions{}, func(held context.Context, l domain.Lock) error {
			go func() {
				h, err := c.Locks.Take(ctx, "B", plan1, application.AcquireOptions{Wait: true})
				if err == nil {
					_, err = h.Release(ctx)
				}
				waiter <- err
			}()
			require.Eventually(t, func() bool { return c.Locks.Waiting(plan1) == 1 }, 10*time.Second, time.Millisecond)
			nested := make(chan error, 1)
			go func() {
				h, err := c.Locks.Take(held, "A", plan1, application.AcquireOptions{Wait: true, Timeout: time.Hour})
				if h != nil {
					_, _ = h.Release(ctx)
				}
				nested <- err
			}()
			err := within(t, nested, "the nested Take(Wait)")
			require.ErrorIs(t, err, domain.ErrConflict, "refused at once, with why")
			var ce *domain.LockConflictError
			require.ErrorAs(t, err, &ce)
			assert.True(t, ce.Nested)
			assert.Equal(t, l.Token, ce.Holder.Token)
			assert.Contains(t, err.Error(), "would wait for itself")

			// Asked for, the re-entry is granted at once, on the same
			// acquisition, and its release leaves the lock to Do.
			inner, err := c.Locks.Take(held, "A", plan1, application.AcquireOptions{Wait: true, Reentrant: true})
			require.NoError(t, err)
			assert.Equal(t, l.Token, inner.Lock().Token)
			ok, err := inner.Release(ctx)
			require.NoError(t, err)
			assert.False(t, ok, "the re-entry removes nothing")
			stored, err := c.Locks.Get(ctx, plan1)
			require.NoError(t, err)
			assert.Equal(t, l.Token, stored.Token, "Do still holds its lock")
			assert.Equal(t, 1, c.Locks.Waiting(plan1), "B still waits")
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, within(t, waiter, "B's wait"))
	})
}

// Item 5: a handle releases by its token: a lost handle never deletes the
// same owner's newer lock.
func TestHandle_ReleaseByToken(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachStore(t, func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		h, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		_, err = c.Locks.Release(ctx, "A", plan1)
		require.NoError(t, err)
		newer, err := c.Locks.Acquire(ctx, "A", plan1, time.Minute)
		require.NoError(t, err)
		ok, err := h.Release(ctx)
		assert.False(t, ok, "the handle's own lock was gone")
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason, "A's newer lock is another acquisition")
		got, err := c.Locks.Get(ctx, plan1)
		require.NoError(t, err, "A's newer lock survives the stale handle's release")
		assert.Equal(t, newer, got)
	})
}

// Item 6: the loss message says what is known: a lock removed and then
// taken did not "expire" at an instant still to come.
func TestHandle_TakenOverMessageIsTrue(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachStore(t, func(t *testing.T, c *locks.Container) {
		ctx := context.Background()
		h, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Minute})
		require.NoError(t, err)
		_, err = c.Locks.Release(ctx, "A", plan1)
		require.NoError(t, err)
		b, err := c.Locks.Acquire(ctx, "B", plan1, time.Minute)
		require.NoError(t, err)
		err = h.Lost(ctx)
		var lost *domain.LockLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, domain.LostTakenOver, lost.Reason)
		assert.True(t, h.Lock().ExpiresAt.After(b.AcquiredAt))
		assert.NotContains(t, err.Error(), "after it expired", "the lock had not expired: %v", err)
		assert.Contains(t, err.Error(), "before", err.Error())
		_, _ = h.Release(ctx)
	})
}

// Item 7: the edges a user hits.
func TestHandle_Edges(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	t.Run("DoNilFunction", func(t *testing.T) {
		eachStore(t, func(t *testing.T, c *locks.Container) {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = errors.New("Do panicked")
					}
				}()
				err = c.Locks.Do(ctx, "A", plan1, application.AcquireOptions{}, nil)
			}()
			require.ErrorIs(t, err, domain.ErrValidation, "got %v", err)
			assert.Empty(t, allLocks(t, c), "nothing acquired")
		})
	})
	t.Run("TimeoutWithoutWait", func(t *testing.T) {
		eachStore(t, func(t *testing.T, c *locks.Container) {
			_, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{Timeout: time.Minute})
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve, "got %v", err)
			assert.Equal(t, "timeout", ve.Field)
			err = c.Locks.Do(ctx, "A", plan1, application.AcquireOptions{Timeout: time.Minute},
				func(context.Context, domain.Lock) error { return nil })
			require.ErrorAs(t, err, &ve)
			assert.Empty(t, allLocks(t, c), "nothing acquired")
		})
	})
	t.Run("CloseEndsKeepAliveContexts", func(t *testing.T) {
		for i := range 50 {
			c, err := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase, Owner: "A", Clock: newMock()})
			require.NoError(t, err)
			h, err := c.Locks.Take(ctx, "A", plan1, application.AcquireOptions{})
			require.NoError(t, err)
			held := h.KeepAlive(ctx)
			require.NoError(t, c.Close())
			select {
			case <-held.Done():
			default:
				t.Fatalf("round %d: Close returned before the keep-alive context it ends had ended", i)
			}
			var lost *domain.LockLostError
			require.ErrorAs(t, context.Cause(held), &lost)
			assert.Equal(t, domain.LostClosed, lost.Reason)
			_, _ = h.Release(ctx)
		}
	})
}
