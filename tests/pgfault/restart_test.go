//go:build unix

package pgfault

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/pgserver"
)

func TestFault_ServerRestart(t *testing.T) {
	s := pgserver.Start(t)
	dsn := s.CreateDatabase("locks")
	c := openContainer(t, dsn, "owner")
	ctx := context.Background()
	// Every statement of the hot path has been prepared on the pool
	// before the server goes away.
	held, err := c.Locks.Acquire(ctx, "owner", plan("held"), time.Minute)
	require.NoError(t, err)
	_, err = c.Locks.Renew(ctx, "owner", plan("held"), time.Minute)
	require.NoError(t, err)
	tmp, err := c.Locks.Acquire(ctx, "owner", plan("tmp"), time.Minute)
	require.NoError(t, err)
	ok, err := c.Locks.Release(ctx, "owner", plan("tmp"))
	require.NoError(t, err)
	require.True(t, ok)
	last := tmp.Token
	var released *domain.Lock // the last lock released before a stop

	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			s.Stop(mode)

			t.Run("down", func(t *testing.T) {
				cctx, cancel := context.WithTimeout(ctx, call)
				defer cancel()
				_, err := c.Locks.Acquire(cctx, "owner", plan("down"), time.Minute)
				requireStoreError(t, err, domain.StoreUnreachable)
				_, err = c.Locks.Renew(cctx, "owner", plan("held"), time.Minute)
				requireStoreError(t, err, domain.StoreUnreachable)
				_, err = c.Locks.Get(cctx, plan("held"))
				requireStoreError(t, err, domain.StoreUnreachable)
				_, err = c.Locks.Release(cctx, "owner", plan("held"))
				requireStoreError(t, err, domain.StoreUnreachable)
			})

			s.Restart()

			t.Run("back", func(t *testing.T) {
				admin := s.Open("locks")
				rows := lockRows(t, admin)
				if mode == "immediate" && released != nil && len(rows) == 2 {
					// A release commits without waiting for the WAL
					// flush (adapters/postgres/commit.go): one just before
					// a crash may be lost, and its lock back, as it was.
					require.Equal(t, storedRow(*released), rows[1], "a lost release brings its lock back as it was")
					rows = rows[:1]
					ok, err := c.Locks.Release(ctx, released.Owner, released.Resource)
					require.NoError(t, err)
					require.True(t, ok, "the holder releases the lock that came back")
				}
				require.Len(t, rows, 1, "only the committed lock survives, and nothing the failed calls began")
				require.Equal(t, held.Token, rows[0].Token)
				require.Equal(t, migrations(t), versions(t, admin))

				got, err := c.Locks.Get(ctx, plan("held"))
				require.NoError(t, err)
				require.Equal(t, held.Token, got.Token)
				_, err = c.Locks.Renew(ctx, "owner", plan("held"), time.Minute)
				require.NoError(t, err)
				l, err := c.Locks.Acquire(ctx, "owner", plan("after-"+mode), time.Minute)
				require.NoError(t, err)
				require.Greater(t, l.Token, last, "tokens keep growing across the restart")
				last = l.Token
				ok, err := c.Locks.Release(ctx, "owner", plan("after-"+mode))
				require.NoError(t, err)
				require.True(t, ok)
				released = &l
				list, err := c.Locks.List(ctx, application.ListOptions{})
				require.NoError(t, err)
				require.Len(t, list, 1)
			})
		})
	}
}
