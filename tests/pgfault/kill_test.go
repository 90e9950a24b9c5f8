//go:build unix

package pgfault

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/pgserver"
)

// A trigger that makes the commit of one acquisition sleep: the
// acquisition's transaction has inserted its row and stays open, on a
// backend the test can find (waiting on PgSleep) and terminate.
const stallTrigger = `
CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.resource_id = 'stalled' THEN PERFORM pg_sleep(120); END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER stall_commit AFTER INSERT ON locks
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall_commit();
`

func TestFault_ConnectionKilled(t *testing.T) {
	s := pgserver.Start(t)
	dsn := s.CreateDatabase("locks")
	c := openContainer(t, dsn, "victim")
	admin := s.Open("locks")
	ctx := context.Background()

	held, err := c.Locks.Acquire(ctx, "victim", plan("held"), time.Minute)
	require.NoError(t, err)
	_, err = admin.Exec(stallTrigger)
	require.NoError(t, err)

	t.Run("mid-transaction", func(t *testing.T) {
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(ctx, call)
			defer cancel()
			_, err := c.Locks.Acquire(ctx, "victim", plan("stalled"), time.Minute)
			errc <- err
		}()
		pid := waitBackend(t, admin, "wait_event = 'PgSleep'")
		// The row is written but not committed: nobody else sees it.
		require.Len(t, lockRows(t, admin), 1)
		var ok bool
		require.NoError(t, admin.QueryRow("SELECT pg_terminate_backend($1)", pid).Scan(&ok))
		require.True(t, ok)

		select {
		case err = <-errc:
		case <-time.After(call):
			t.Fatal("the acquisition whose connection was killed did not return")
		}
		requireStoreError(t, err, domain.StoreUnreachable)
		rows := lockRows(t, admin)
		require.Len(t, rows, 1, "the killed transaction left nothing behind")
		require.Equal(t, held.Token, rows[0].Token)
		require.Equal(t, migrations(t), versions(t, admin))
	})

	t.Run("recovers", func(t *testing.T) {
		_, err := admin.Exec("DROP TRIGGER stall_commit ON locks")
		require.NoError(t, err)
		l, err := c.Locks.Acquire(ctx, "victim", plan("stalled"), time.Minute)
		require.NoError(t, err)
		require.Greater(t, l.Token, held.Token)
		got, err := c.Locks.Get(ctx, plan("held"))
		require.NoError(t, err)
		require.Equal(t, held.Token, got.Token)
		ok, err := c.Locks.Release(ctx, "victim", plan("stalled"))
		require.NoError(t, err)
		require.True(t, ok)
	})

	t.Run("idle connections killed", func(t *testing.T) {
		// Every connection of the container's pool dies while idle, as
		// when a pooler or an administrator drops them; the next calls
		// connect again and prepare their statements anew.
		_, err := admin.Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity " +
			"WHERE datname = 'locks' AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
		require.NoError(t, err)
		time.Sleep(1100 * time.Millisecond) // past the driver's check of a connection idle over a second
		_, err = c.Locks.Renew(ctx, "victim", plan("held"), time.Minute)
		require.NoError(t, err)
		l, err := c.Locks.Acquire(ctx, "victim", plan("again"), time.Minute)
		require.NoError(t, err)
		require.Greater(t, l.Token, held.Token)
		n, err := c.Locks.ReleaseAllForOwner(ctx, "victim")
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Empty(t, lockRows(t, admin))
	})
}

// waitBackend returns the pid of the client backend of database "locks"
// that matches cond, waiting for it to appear.
func waitBackend(t *testing.T, admin *sql.DB, cond string) int {
	t.Helper()
	deadline := time.Now().Add(call)
	for {
		var pid int
		err := admin.QueryRow("SELECT pid FROM pg_stat_activity WHERE datname = 'locks' AND " + cond).Scan(&pid)
		if err == nil {
			return pid
		}
		require.ErrorIs(t, err, sql.ErrNoRows)
		if time.Now().After(deadline) {
			t.Fatalf("no backend where %s after %v", cond, call)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
