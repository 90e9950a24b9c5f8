package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest"
)

// MustOpenDB opens a new database file in a temporary directory and closes
// it when the test ends.
func MustOpenDB(tb testing.TB) *sqlite.DB {
	tb.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(tb.TempDir(), "locks.db"), sqlite.Options{})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, db.Close()) })
	return db
}

func TestLockRepository_Contract(t *testing.T) {
	locktest.Run(t, func(t *testing.T) application.LockRepository {
		return sqlite.NewLockRepository(MustOpenDB(t))
	})
}

// An acquire of a resource that has a row is refused by the unique index
// and left to Update; the refused insert must draw no token, or the next
// lock's token would skip one.
func TestAcquireAt_RefusedInsertDrawsNoToken(t *testing.T) {
	repo := sqlite.NewLockRepository(MustOpenDB(t))
	ctx := t.Context()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	at := func() (time.Time, time.Time) { return now, now.Add(time.Minute) }
	plan := func(id string) domain.ResourceRef { return domain.ResourceRef{Type: domain.ResourcePlan, ID: id} }

	first, err := repo.AcquireAt(ctx, plan("p1"), "alice", at)
	require.NoError(t, err)
	out, err := repo.AcquireAt(ctx, plan("p1"), "bob", at)
	require.NoError(t, err)
	require.Equal(t, application.ChangeNone, out.Kind, "a resource with a row goes to Update")
	held, err := repo.Get(ctx, plan("p1"))
	require.NoError(t, err)
	require.Equal(t, first.Lock, held, "the refused insert changed nothing")

	next, err := repo.AcquireAt(ctx, plan("p2"), "bob", at)
	require.NoError(t, err)
	require.Equal(t, first.Lock.Token+1, next.Lock.Token, "the refused insert drew no token")
}

// The SQL function that dates a lone acquire is registered for every
// connection of the process: called by anything but the store's own
// insert, it fails rather than hand out a time of no clock.
func TestLockTime_RefusedToOthers(t *testing.T) {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "other.db"))
	require.NoError(t, err)
	defer db.Close()
	var v any
	err = db.QueryRow("SELECT cleveragents_locks_time(1, 0, 0)").Scan(&v)
	require.Error(t, err, "got %v", v)
	require.Contains(t, err.Error(), "the lock store's own")
}
