package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// insertBody is a write that stores a lock on plan/id, and records the
// transaction it ran in.
func insertBody(id string, txs *sync.Map) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		txs.Store(id, tx)
		_, err := tx.ExecContext(ctx, "INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at) VALUES ('A', 'plan', ?, '2026-11-30T00:00:00.000000Z', '2099-01-01T00:00:00.000000Z')", id)
		return err
	}
}

// blockedLeader starts a write whose body holds the transaction until the
// returned function is called, and waits until it does, so that the writes
// started meanwhile queue and share the next transaction.
func blockedLeader(t *testing.T, db *sqlite.DB) (release func() error) {
	t.Helper()
	inside, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- db.WriteTx(context.Background(), entstore.Statements, func(context.Context, *sql.Tx) error {
			close(inside)
			<-proceed
			return nil
		})
	}()
	<-inside
	return func() error { close(proceed); return <-done }
}

// queued starts the writes one after the other, each once the one before
// is queued, so that they queue in this order behind the leader; each
// result arrives on its channel. The first of them leads the next batch.
func queued(t *testing.T, db *sqlite.DB, calls ...func() error) []chan error {
	t.Helper()
	out := make([]chan error, len(calls))
	for i, call := range calls {
		out[i] = make(chan error, 1)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					out[i] <- fmt.Errorf("panicked: %v", p)
				}
			}()
			out[i] <- call()
		}()
		require.Eventually(t, func() bool { return sqlite.Queued(db) == i+1 }, 10*time.Second, time.Millisecond)
	}
	return out
}

func stored(t *testing.T, db *sqlite.DB, id string) bool {
	t.Helper()
	_, err := sqlite.NewLockRepository(db).Get(context.Background(), domain.ResourceRef{Type: domain.ResourcePlan, ID: id})
	if errors.Is(err, domain.ErrNotFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

func TestGroupCommit(t *testing.T) {
	ctx := context.Background()

	t.Run("EachBodyStandsAlone", func(t *testing.T) {
		// One transaction carries a success, a body that fails after
		// writing, a panic after writing and another success: only the
		// successes stay, and each caller gets its own outcome.
		db := MustOpenDB(t)
		var txs sync.Map
		errOwn := errors.New("the body's own reason")
		finish := blockedLeader(t, db)
		res := queued(t, db,
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("ok-1", &txs)) },
			func() error {
				return db.WriteTx(ctx, entstore.Statements, func(ctx context.Context, tx *sql.Tx) error {
					require.NoError(t, insertBody("failed", &txs)(ctx, tx))
					return errOwn
				})
			},
			func() error {
				return db.WriteTx(ctx, entstore.Statements, func(ctx context.Context, tx *sql.Tx) error {
					require.NoError(t, insertBody("panicked", &txs)(ctx, tx))
					panic("in the body")
				})
			},
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("ok-2", &txs)) },
		)
		require.NoError(t, finish())
		assert.NoError(t, <-res[0])
		assert.ErrorIs(t, <-res[1], errOwn)
		assert.EqualError(t, <-res[2], "panicked: in the body")
		assert.NoError(t, <-res[3])
		first, _ := txs.Load("ok-1")
		txs.Range(func(id, tx any) bool {
			assert.Same(t, first, tx, "%s ran in another transaction: no batch", id)
			return true
		})
		assert.True(t, stored(t, db, "ok-1"))
		assert.True(t, stored(t, db, "ok-2"))
		assert.False(t, stored(t, db, "failed"), "a failed body's write stayed")
		assert.False(t, stored(t, db, "panicked"), "a panicking body's write stayed")
	})

	t.Run("LoneStatementAfterASharedBatchGathers", func(t *testing.T) {
		// The callers of a shared batch are about to write again: a lone
		// statement behind it begins a transaction for them to join, where
		// a lone statement behind a lone write runs by itself (tx nil).
		db := MustOpenDB(t)
		txOf := func() (tx *sql.Tx) {
			require.NoError(t, db.WriteTx(ctx, entstore.OneStatement, func(_ context.Context, in *sql.Tx) error { tx = in; return nil }))
			return tx
		}
		require.Nil(t, txOf(), "a lone statement on a new store")
		var txs sync.Map
		finish := blockedLeader(t, db)
		res := queued(t, db,
			func() error { return db.WriteTx(ctx, entstore.OneStatement, insertBody("a", &txs)) },
			func() error { return db.WriteTx(ctx, entstore.OneStatement, insertBody("b", &txs)) },
		)
		require.NoError(t, finish())
		require.NoError(t, <-res[0])
		require.NoError(t, <-res[1])
		assert.NotNil(t, txOf(), "after a shared batch")
		assert.Nil(t, txOf(), "after a lone write")
	})

	t.Run("NoCallReturnsBeforeTheCommit", func(t *testing.T) {
		db := MustOpenDB(t)
		var txs sync.Map
		inLast, proceed := make(chan struct{}), make(chan struct{})
		finish := blockedLeader(t, db)
		res := queued(t, db,
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("head", &txs)) },
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("early", &txs)) },
			func() error {
				return db.WriteTx(ctx, entstore.Statements, func(context.Context, *sql.Tx) error {
					close(inLast)
					<-proceed
					return nil
				})
			},
		)
		go finish()
		<-inLast
		select {
		case err := <-res[1]:
			t.Fatalf("a write returned (%v) before its transaction committed", err)
		case <-time.After(100 * time.Millisecond):
		}
		assert.False(t, stored(t, db, "early"), "a reader saw an uncommitted write")
		close(proceed)
		for _, r := range res {
			require.NoError(t, <-r)
		}
		assert.True(t, stored(t, db, "early"))
	})

	t.Run("WithdrawnWhileQueued", func(t *testing.T) {
		db := MustOpenDB(t)
		var txs sync.Map
		cctx, cancel := context.WithCancel(ctx)
		finish := blockedLeader(t, db)
		res := queued(t, db, func() error { return db.WriteTx(cctx, entstore.Statements, insertBody("withdrawn", &txs)) })
		cancel()
		require.ErrorIs(t, <-res[0], context.Canceled) // while the leader still holds the transaction
		require.NoError(t, finish())
		_, ran := txs.Load("withdrawn")
		assert.False(t, ran, "a withdrawn write ran")
		assert.False(t, stored(t, db, "withdrawn"))
	})

	t.Run("GivenUpInsideTheBatch", func(t *testing.T) {
		// A caller whose context ends while its body runs is told so, and
		// its write is undone; the others in the batch commit.
		db := MustOpenDB(t)
		var txs sync.Map
		cctx, cancel := context.WithCancel(ctx)
		finish := blockedLeader(t, db)
		res := queued(t, db,
			func() error {
				return db.WriteTx(cctx, entstore.Statements, func(ctx context.Context, tx *sql.Tx) error {
					cancel()
					return insertBody("given-up", &txs)(ctx, tx)
				})
			},
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("kept", &txs)) },
		)
		require.NoError(t, finish())
		require.ErrorIs(t, <-res[0], context.Canceled)
		require.NoError(t, <-res[1])
		assert.False(t, stored(t, db, "given-up"))
		assert.True(t, stored(t, db, "kept"))
	})

	t.Run("APurgeRunsAlone", func(t *testing.T) {
		// A purge's write queued between others shares no transaction:
		// the writes ahead of it do not wait for its statement, and it
		// runs as a statement of its own.
		db := MustOpenDB(t)
		var txs sync.Map
		purge := func(ctx context.Context, tx *sql.Tx) error {
			txs.Store("purge", tx)
			return nil
		}
		finish := blockedLeader(t, db)
		res := queued(t, db,
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("ahead", &txs)) },
			func() error { return db.WriteTx(ctx, entstore.Cleanup, purge) },
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("behind-1", &txs)) },
			func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("behind-2", &txs)) },
		)
		require.NoError(t, finish())
		for _, r := range res {
			require.NoError(t, <-r)
		}
		tx := func(id string) *sql.Tx {
			v, ok := txs.Load(id)
			require.True(t, ok, "%s did not run", id)
			return v.(*sql.Tx)
		}
		assert.Nil(t, tx("purge"), "the purge ran in a transaction, not alone")
		assert.NotSame(t, tx("ahead"), tx("behind-1"), "the writes on either side of the purge shared a transaction")
		assert.Same(t, tx("behind-1"), tx("behind-2"), "the writes behind the purge did not share a transaction")
	})

	t.Run("LeadPassesOn", func(t *testing.T) {
		// More writers than one batch holds: all of them finish, whichever
		// caller leads, and every write is stored.
		db := MustOpenDB(t)
		var txs sync.Map
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := range 40 {
					assert.NoError(t, db.WriteTx(ctx, entstore.Statements, insertBody(fmt.Sprintf("w%d-%d", w, i), &txs)))
				}
			})
		}
		wg.Wait()
		n, err := sqlite.NewLockRepository(db).List(ctx, application.ListFilter{})
		require.NoError(t, err)
		assert.Len(t, n, 320)
	})
}

// TestGroupCommit_LoneStatementRetriedWhenBusy: a release that runs alone,
// as one statement outside any transaction, and finds SQLite's write lock
// held by a process that does not queue with the others (an older
// version, the sqlite3 shell) past the busy timeout, is retried like any
// write, not failed at once.
func TestGroupCommit_LoneStatementRetriedWhenBusy(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{BusyTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })

	other, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	require.NoError(t, err)
	defer other.Close()
	tx, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.Exec("UPDATE locks SET owner_id = owner_id")
	require.NoError(t, err)
	time.AfterFunc(80*time.Millisecond, func() { tx.Commit() }) // longer than one busy timeout

	_, err = sqlite.NewLockRepository(db).DeleteOwned(ctx, domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, "alice")
	require.NoError(t, err)
}
