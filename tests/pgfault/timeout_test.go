//go:build unix

package pgfault

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/pgserver"
)

// TestFault_Timeout runs containers whose role waits a bounded time
// (lock_timeout, statement_timeout, or the caller's context) while
// another transaction holds the resource: the acquisition of a holder
// whose commit stalls (it holds the resource's lock inside the store),
// and a transaction of an administrator that holds a lock's row.
func TestFault_Timeout(t *testing.T) {
	s := pgserver.Start(t)
	s.Exec("postgres",
		"CREATE ROLE app LOGIN",
		"CREATE DATABASE locks OWNER app",
		"CREATE ROLE app_lock_timeout LOGIN IN ROLE app",
		"ALTER ROLE app_lock_timeout SET lock_timeout = '300ms'",
		"CREATE ROLE app_statement_timeout LOGIN IN ROLE app",
		"ALTER ROLE app_statement_timeout SET statement_timeout = '300ms'",
	)
	holder := openContainer(t, s.UserDSN("app", "locks"), "holder") // migrates, as the owner
	admin := s.Open("locks")
	_, err := admin.Exec(stallTrigger)
	require.NoError(t, err)
	ctx := context.Background()

	// The holder's acquisition of "stalled" keeps the resource locked
	// inside the store until its backend is terminated.
	holderErr := make(chan error, 1)
	go func() {
		_, err := holder.Locks.Acquire(ctx, "holder", plan("stalled"), time.Minute)
		holderErr <- err
	}()
	holderPID := waitBackend(t, admin, "wait_event = 'PgSleep'")

	cases := []struct {
		name, role string
		timeout    time.Duration // of the caller's context; 0 for none
		check      func(t *testing.T, err error)
	}{
		{"lock_timeout", "app_lock_timeout", 0, func(t *testing.T, err error) {
			requireStoreError(t, err, domain.StoreBusy)
		}},
		{"statement_timeout", "app_statement_timeout", 0, func(t *testing.T, err error) {
			requireStoreError(t, err, domain.StoreBusy)
		}},
		{"context deadline", "app", 300 * time.Millisecond, func(t *testing.T, err error) {
			require.ErrorIs(t, err, context.DeadlineExceeded)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			owner := "waiter-" + tc.role
			c := openContainer(t, s.UserDSN(tc.role, "locks"), owner)
			call := func() (context.Context, context.CancelFunc) {
				if tc.timeout > 0 {
					return context.WithTimeout(ctx, tc.timeout)
				}
				return context.WithTimeout(ctx, call)
			}

			t.Run("acquire behind a held resource", func(t *testing.T) {
				cctx, cancel := call()
				defer cancel()
				start := time.Now()
				_, err := c.Locks.Acquire(cctx, owner, plan("stalled"), time.Minute)
				tc.check(t, err)
				require.Less(t, time.Since(start), 10*time.Second, "the wait is bounded by the timeout")
				requireNothingWaiting(t, admin, tc.role)
				require.Empty(t, rowsOf(t, admin, owner), "the refused acquisition wrote nothing")
			})

			t.Run("release behind a held row", func(t *testing.T) {
				_, err := c.Locks.Acquire(ctx, owner, plan("mine"), time.Minute)
				require.NoError(t, err)
				tx, err := admin.Begin()
				require.NoError(t, err)
				defer tx.Rollback()
				_, err = tx.Exec("SELECT 1 FROM locks WHERE owner_id = $1 FOR UPDATE", owner)
				require.NoError(t, err)

				cctx, cancel := call()
				defer cancel()
				_, err = c.Locks.Release(cctx, owner, plan("mine"))
				tc.check(t, err)
				// Were the DELETE still queued on the server, it would
				// release the lock once the row is free, after its caller
				// was told that it failed.
				requireNothingWaiting(t, admin, tc.role)
				require.NoError(t, tx.Rollback())
				require.Len(t, rowsOf(t, admin, owner), 1, "the lock the failed release left is whole")

				ok, err := c.Locks.Release(ctx, owner, plan("mine"))
				require.NoError(t, err, "the container works once the row is free")
				require.True(t, ok)
				require.Empty(t, rowsOf(t, admin, owner))
			})
		})
	}

	t.Run("the resource is free again", func(t *testing.T) {
		var ok bool
		require.NoError(t, admin.QueryRow("SELECT pg_terminate_backend($1)", holderPID).Scan(&ok))
		requireStoreError(t, <-holderErr, domain.StoreUnreachable)
		_, err := admin.Exec("DROP TRIGGER stall_commit ON locks")
		require.NoError(t, err)
		for _, role := range []string{"app_lock_timeout", "app_statement_timeout", "app"} {
			c := openContainer(t, s.UserDSN(role, "locks"), "next-"+role)
			_, err := c.Locks.Acquire(ctx, "next-"+role, plan("stalled"), time.Minute)
			require.NoError(t, err, role)
			ok, err := c.Locks.Release(ctx, "next-"+role, plan("stalled"))
			require.NoError(t, err, role)
			require.True(t, ok)
		}
		require.Empty(t, lockRows(t, admin))
		require.Equal(t, migrations(t), versions(t, admin))
	})
}

// requireNothingWaiting asserts that no statement of role is still
// waiting on a lock on the server, a moment after its call returned: a
// call that gave up must not leave its statement behind, holding a
// connection slot and applying its write whenever the lock comes free.
func requireNothingWaiting(t *testing.T, admin *sql.DB, role string) {
	t.Helper()
	// The server acts on a cancel request in milliseconds, and a loaded
	// machine may take seconds; a statement left behind waits as long as
	// its lock is held, which outlasts any grace.
	const grace = call
	deadline := time.Now().Add(grace)
	for {
		var query string
		err := admin.QueryRow("SELECT query FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'",
			role).Scan(&query)
		if errors.Is(err, sql.ErrNoRows) {
			return
		}
		require.NoError(t, err)
		if time.Now().After(deadline) {
			t.Fatalf("%v after its call returned, a statement of %s still waits on the server: %s", grace, role, query)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rowsOf returns the rows of the locks table that owner holds.
func rowsOf(t *testing.T, db *sql.DB, owner string) []lockRow {
	t.Helper()
	var out []lockRow
	for _, r := range lockRows(t, db) {
		if r.Owner == owner {
			out = append(out, r)
		}
	}
	return out
}
