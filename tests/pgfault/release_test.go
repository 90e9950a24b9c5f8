//go:build unix

package pgfault

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/pgserver"
)

// A release commits without waiting for the WAL flush
// (adapters/postgres/commit.go). What a crash right after it may do, and
// may not: bring the lock back exactly as it was, which keeps its resource
// from others until that lock's expiry, never give the resource to a
// second holder; and once another acquire of the resource has returned,
// the release is as durable as that acquire.
func TestFault_ReleaseBeforeACrash(t *testing.T) {
	s := pgserver.Start(t)
	dsn := s.CreateDatabase("locks")
	ctx := context.Background()

	t.Run("ComesBackAsItWasOrNotAtAll", func(t *testing.T) {
		a := openContainer(t, dsn, "a")
		l, err := a.Locks.Acquire(ctx, "a", plan("lost"), time.Minute)
		require.NoError(t, err)
		ok, err := a.Locks.Release(ctx, "a", plan("lost"))
		require.NoError(t, err)
		require.True(t, ok)
		s.Stop("immediate")
		s.Restart()

		rows := lockRows(t, s.Open("locks"))
		if len(rows) == 0 {
			t.Log("the release reached the disk before the crash")
			return
		}
		require.Equal(t, []lockRow{storedRow(l)}, rows, "a lost release brings its lock back as it was")
		b := openContainer(t, dsn, "b")
		cctx, cancel := context.WithTimeout(ctx, call)
		defer cancel()
		_, err = b.Locks.Acquire(cctx, "b", plan("lost"), time.Minute)
		var conflict *domain.LockConflictError
		require.True(t, errors.As(err, &conflict), "a second holder got the lock back from a lost release: %v", err)
		require.Equal(t, "a", conflict.Holder.Owner)
	})

	t.Run("TheNextAcquireMakesItDurable", func(t *testing.T) {
		a := openContainer(t, dsn, "a")
		b := openContainer(t, dsn, "b")
		_, err := a.Locks.Acquire(ctx, "a", plan("handed"), time.Minute)
		require.NoError(t, err)
		ok, err := a.Locks.Release(ctx, "a", plan("handed"))
		require.NoError(t, err)
		require.True(t, ok)
		l, err := b.Locks.Acquire(ctx, "b", plan("handed"), time.Minute)
		require.NoError(t, err)
		s.Stop("immediate")
		s.Restart()

		var rows []lockRow
		for _, r := range lockRows(t, s.Open("locks")) {
			if r.ID == "handed" {
				rows = append(rows, r)
			}
		}
		require.Equal(t, []lockRow{storedRow(l)}, rows, "only the acquire that followed the release stands")
	})
}
