package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// journals are the journal modes a store must be right on: WAL, the
// default, and a rollback journal, which a DSN may ask for. On a rollback
// journal a reader's SHARED lock keeps a COMMIT from taking the EXCLUSIVE
// lock it needs, so a COMMIT itself can stay busy and be rolled back.
var journals = []string{"WAL", "DELETE"}

// openJournal opens a lock store on a new file with the given journal
// mode, busy timeout and extra DSN parameters.
func openJournal(t *testing.T, journal string, busy time.Duration, params ...string) (db *sqlite.DB, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "locks.db")
	dsn := "file:" + path + "?_journal_mode=" + journal
	for _, p := range params {
		dsn += "&" + p
	}
	db, err := sqlite.Open(context.Background(), dsn, sqlite.Options{BusyTimeout: busy})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, path
}

// otherConn opens another connection pool on the file, as another
// process would, with the given DSN parameters.
func otherConn(t *testing.T, path, params string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?"+params)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// holdShared begins a read transaction on another connection and returns
// the function that ends it. On a rollback journal it holds SQLite's
// SHARED lock, which makes every COMMIT wait for it, even one that changes
// nothing.
func holdShared(ctx context.Context, reader *sql.DB) (end func() error, err error) {
	tx, err := reader.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM locks").Scan(&n); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx.Rollback, nil
}

// retryOnce returns a write to queue last in a batch: it makes the
// batch's first run fail as a whole because the database is busy, and
// lets the second run commit.
//
// On a rollback journal the busy COMMIT is real: the write's first run
// has another connection take a SHARED lock (which a transaction that
// holds the RESERVED lock still lets in), so the COMMIT waits past the
// busy timeout and is rolled back; the second run ends the read. On WAL,
// where readers never block a COMMIT, the write's first run fails with
// the SQLITE_BUSY that another connection's BEGIN IMMEDIATE gets at that
// moment, as a statement that met another writer would.
func retryOnce(t *testing.T, path, journal string) (write func(db *sqlite.DB) error) {
	t.Helper()
	reader := otherConn(t, path, "_busy_timeout=5000")
	probe := otherConn(t, path, "_txlock=immediate&_busy_timeout=0")
	var (
		runs atomic.Int32
		end  = func() error { return nil }
	)
	t.Cleanup(func() { end() })
	return func(db *sqlite.DB) error {
		return db.WriteTx(context.Background(), entstore.OneStatement, func(ctx context.Context, tx *sql.Tx) error {
			if tx == nil {
				return fmt.Errorf("the write meant to share a batch ran alone")
			}
			if runs.Add(1) > 1 {
				return end()
			}
			if journal != "WAL" {
				var err error
				end, err = holdShared(ctx, reader)
				return err // nil: the COMMIT will stay busy
			}
			ptx, err := probe.BeginTx(ctx, nil)
			if err == nil {
				ptx.Rollback()
				return fmt.Errorf("another connection began a write while the batch held the write lock")
			}
			return err
		})
	}
}

// onLaterRuns returns a write of one statement that does nothing on the
// first run of its batch and runs query on each later run: another
// holder's change, made between the runs.
func onLaterRuns(db *sqlite.DB, runs *atomic.Int32, query string, args ...any) func() error {
	return func() error {
		return db.WriteTx(context.Background(), entstore.OneStatement, func(ctx context.Context, tx *sql.Tx) error {
			if runs.Add(1) == 1 {
				return nil
			}
			_, err := tx.ExecContext(ctx, query, args...)
			return err
		})
	}
}

const insertLockSQL = "INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at) VALUES (?, 'plan', ?, '2026-12-01T00:00:00.000000Z', '2099-01-01T00:00:00.000000Z')"

var p1 = domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}

func mockClock() *clock.Mock {
	c := clock.NewMock()
	c.Set(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	return c
}

// TestGroupCommit_RetriedBatch: a batch whose first run is rolled back
// (a busy COMMIT on a rollback journal, a busy statement on WAL) runs
// every body again from nothing; what a body decided on the run that was
// rolled back does not reach its caller.
func TestGroupCommit_RetriedBatch(t *testing.T) {
	ctx := context.Background()
	for _, journal := range journals {
		t.Run(journal, func(t *testing.T) {
			t.Run("AcquireMeetsAnotherHoldersRow", func(t *testing.T) {
				// The first run inserts alice's lock; the second meets
				// bob's row, written between the runs. Alice must be
				// refused, not told of the token that was rolled back.
				db, path := openJournal(t, journal, 200*time.Millisecond)
				svc, err := application.NewLockService(sqlite.NewLockRepository(db), mockClock(), time.Minute)
				require.NoError(t, err)
				fault := retryOnce(t, path, journal)
				var bobRuns atomic.Int32
				finish := blockedLeader(t, db)
				res := queued(t, db,
					onLaterRuns(db, &bobRuns, insertLockSQL, "bob", p1.ID),
					func() error {
						l, err := svc.Acquire(ctx, "alice", p1, 0)
						if err == nil {
							return fmt.Errorf("alice was told she holds %s with token %d", p1, l.Token)
						}
						return err
					},
					func() error { return fault(db) },
				)
				require.NoError(t, finish())
				require.NoError(t, <-res[0])
				require.NoError(t, <-res[2])
				err = <-res[1]
				var conflict *domain.LockConflictError
				require.ErrorAs(t, err, &conflict)
				assert.Equal(t, "bob", conflict.Holder.Owner)
				assert.EqualValues(t, 2, bobRuns.Load(), "the batch did not run twice")
				got, err := sqlite.NewLockRepository(db).Get(ctx, p1)
				require.NoError(t, err)
				assert.Equal(t, "bob", got.Owner)
			})

			t.Run("UpdateRefusedThenTaken", func(t *testing.T) {
				// The first run refuses alice (bob holds the lock); bob's
				// release comes between the runs, and the second run gives
				// alice the lock: she must be told so, not refused.
				db, path := openJournal(t, journal, 200*time.Millisecond)
				repo := sqlite.NewLockRepository(db)
				writeSQL(t, db, entstore.Statements, insertLockSQL, "bob", p1.ID)
				fault := retryOnce(t, path, journal)
				now := mockClock().Now()
				var bobRuns atomic.Int32
				var got domain.Lock
				finish := blockedLeader(t, db)
				res := queued(t, db,
					onLaterRuns(db, &bobRuns, "DELETE FROM locks WHERE owner_id = 'bob'"),
					func() (err error) {
						got, err = repo.Update(ctx, p1, func(cur *domain.Lock) (application.Change, error) {
							return application.DecideAcquire(cur, "alice", p1, now, now.Add(time.Minute))
						})
						return err
					},
					func() error { return fault(db) },
				)
				require.NoError(t, finish())
				require.NoError(t, <-res[0])
				require.NoError(t, <-res[2])
				require.NoError(t, <-res[1], "alice was refused a lock that was committed to her")
				assert.EqualValues(t, 2, bobRuns.Load(), "the batch did not run twice")
				stored, err := repo.Get(ctx, p1)
				require.NoError(t, err)
				assert.Equal(t, "alice", stored.Owner)
				assert.Equal(t, stored.Token, got.Token)
			})
		})
	}
}
