package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// DB.Write runs the application's own transaction in the store's queue:
// committed and visible to any connection when it returns, rolled back
// with fn's own error, refused from inside itself and on a read-only
// store.
func TestWrite(t *testing.T) {
	ctx := context.Background()
	db, path := openStore(t)
	dsn, err := sqlite.DSN(path, 0)
	require.NoError(t, err)
	other, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	defer other.Close()
	count := func() (n int) {
		t.Helper()
		require.NoError(t, other.QueryRow("SELECT count(*) FROM app").Scan(&n))
		return n
	}
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "CREATE TABLE app (id INTEGER PRIMARY KEY)")
		return err
	}))

	t.Run("CommitsBeforeItReturns", func(t *testing.T) {
		before := count()
		require.NoError(t, db.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO app DEFAULT VALUES")
			return err
		}))
		assert.Equal(t, before+1, count(), "another connection sees the write the moment Write returns")
	})
	t.Run("FailureRollsBackWithItsOwnError", func(t *testing.T) {
		before := count()
		mine := errors.New("the application's own refusal")
		err := db.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO app DEFAULT VALUES"); err != nil {
				return err
			}
			return mine
		})
		assert.Same(t, mine, err, "fn's error is returned as it is")
		assert.Equal(t, before, count(), "nothing of a failed fn stays")
	})
	t.Run("CancelledRollsBack", func(t *testing.T) {
		before := count()
		cctx, cancel := context.WithCancel(ctx)
		err := db.Write(cctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO app DEFAULT VALUES")
			cancel() // the caller gives up while its transaction runs
			return err
		})
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, before, count(), "a caller told it failed finds nothing of its write")
	})
	t.Run("LockCallInsideFails", func(t *testing.T) {
		svc, err := application.NewLockService(sqlite.NewLockRepository(db), clock.New(), 0)
		require.NoError(t, err)
		var inner error
		require.NoError(t, db.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			// Bounded, so that a call that waits for fn fails the test
			// rather than hang it.
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, inner = svc.Acquire(ctx, "app", domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, 0)
			return nil
		}))
		var se *domain.StoreError
		require.ErrorAs(t, inner, &se, "an acquire from inside fn fails rather than wait for fn's own transaction")
		assert.Contains(t, se.Error(), "inside DB.Write")
		_, err = svc.Get(ctx, domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"})
		assert.ErrorIs(t, err, domain.ErrNotFound)
	})
	t.Run("ReadOnlyStoreRefuses", func(t *testing.T) {
		ro, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer ro.Close()
		err = ro.Write(ctx, func(context.Context, *sql.Tx) error { return nil })
		assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
	})
}
