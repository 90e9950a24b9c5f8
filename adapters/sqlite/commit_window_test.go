package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/sqlite"
)

// visible reports whether the lock on plan/id is committed, read through
// checker, another connection pool on the file. A read that SQLite
// refuses (a rollback journal's COMMIT under way holds its PENDING lock)
// is an error.
func visible(ctx context.Context, checker *sql.DB, id string) (bool, error) {
	var n int
	err := checker.QueryRowContext(ctx, "SELECT count(*) FROM locks WHERE resource_type = 'plan' AND resource_id = ?", id).Scan(&n)
	return n == 1, err
}

// commitWaiting reports whether a rollback journal's COMMIT is waiting
// for a reader: it holds SQLite's PENDING lock, which lets no new reader
// in, and probe (with no busy timeout) is refused at once.
func commitWaiting(ctx context.Context, probe *sql.DB) bool {
	_, err := visible(ctx, probe, "")
	var serr interface{ Code() int }
	return errors.As(err, &serr) && serr.Code()&0xff == 5 // SQLITE_BUSY
}

// readerInBatch returns a write to queue in a batch: on its first run it
// has reader begin a read transaction, whose SHARED lock keeps the batch's
// COMMIT waiting on a rollback journal, until the returned end is called.
func readerInBatch(t *testing.T, db *sqlite.DB, reader *sql.DB) (write func() error, end func() error) {
	var (
		mu   sync.Mutex
		stop = func() error { return nil }
		runs atomic.Int32
	)
	end = func() error {
		mu.Lock()
		defer mu.Unlock()
		err := stop()
		stop = func() error { return nil }
		return err
	}
	t.Cleanup(func() { end() })
	write = func() error {
		return db.WriteTx(context.Background(), entstore.OneStatement, func(ctx context.Context, tx *sql.Tx) error {
			if runs.Add(1) > 1 {
				return end() // a second run must not wait for itself
			}
			mu.Lock()
			defer mu.Unlock()
			var err error
			stop, err = holdShared(ctx, reader)
			if err != nil {
				stop = func() error { return nil }
			}
			return err
		})
	}
	return write, end
}

// TestGroupCommit_ReturnsAfterItsCommit: a caller of a batch learns that
// its write succeeded only once the write is committed, visible to every
// other connection; and a batch whose COMMIT fails fails every caller.
func TestGroupCommit_ReturnsAfterItsCommit(t *testing.T) {
	ctx := context.Background()
	t.Run("VisibleFromAnotherConnection", func(t *testing.T) {
		for _, journal := range journals {
			t.Run(journal, func(t *testing.T) {
				db, path := openJournal(t, journal, 5*time.Second)
				checker := otherConn(t, path, "_busy_timeout=0")
				rounds := 1
				if journal == "WAL" {
					// Readers never wait for a WAL commit, so nothing holds
					// it back: a caller told before it races the commit,
					// and loses it often enough in this many batches.
					rounds = 40
				}
				for round := range rounds {
					var calls []func() error
					var end func() error
					if journal != "WAL" {
						// The batch's COMMIT waits for a reader until the
						// test has seen it waiting.
						var hold func() error
						hold, end = readerInBatch(t, db, otherConn(t, path, "_busy_timeout=5000"))
						calls = append(calls, hold)
					}
					type seen struct {
						id      string
						err     error // of the write
						visible bool
						readErr error
					}
					results := make(chan seen, 4)
					for i := range 4 {
						id := fmt.Sprintf("r%d-%d", round, i)
						calls = append(calls, func() error {
							s := seen{id: id}
							s.err = db.WriteTx(ctx, entstore.Statements, insertBody(id, &sync.Map{}))
							if s.err == nil {
								s.visible, s.readErr = visible(ctx, checker, id)
							}
							results <- s
							return s.err
						})
					}
					finish := blockedLeader(t, db)
					res := queued(t, db, calls...)
					require.NoError(t, finish())
					if end != nil {
						require.Eventually(t, func() bool { return commitWaiting(ctx, checker) || len(results) > 0 },
							10*time.Second, time.Millisecond)
						require.NoError(t, end())
					}
					for range 4 {
						s := <-results
						require.NoError(t, s.err, s.id)
						require.NoError(t, s.readErr, "%s: its caller returned, but another connection could not read it", s.id)
						require.True(t, s.visible, "%s: its caller returned before another connection could see it", s.id)
					}
					for _, r := range res {
						require.NoError(t, <-r)
					}
				}
			})
		}
	})

	t.Run("FailedCommitFailsEveryCaller", func(t *testing.T) {
		// The COMMIT fails for real: a deferred foreign key that one body
		// leaves violated (SQLite checks it only at COMMIT), or, on a
		// rollback journal, a reader that keeps the COMMIT busy past
		// every retry. No caller of the batch may be told that it wrote.
		violate := func(db *sqlite.DB) func() error {
			return func() error {
				return db.WriteTx(ctx, entstore.Statements, func(ctx context.Context, tx *sql.Tx) error {
					for _, q := range []string{
						"CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY)",
						"CREATE TEMP TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
						"INSERT INTO child VALUES (1)",
					} {
						if _, err := tx.ExecContext(ctx, q); err != nil {
							return err
						}
					}
					return nil
				})
			}
		}
		cases := []struct {
			name, journal string
			busy          time.Duration
			params        []string
			fault         func(t *testing.T, db *sqlite.DB, path string) func() error
		}{
			{"ForeignKey/WAL", "WAL", 5 * time.Second, []string{"_pragma=foreign_keys(1)"},
				func(_ *testing.T, db *sqlite.DB, _ string) func() error { return violate(db) }},
			{"ForeignKey/DELETE", "DELETE", 5 * time.Second, []string{"_pragma=foreign_keys(1)"},
				func(_ *testing.T, db *sqlite.DB, _ string) func() error { return violate(db) }},
			{"Busy/DELETE", "DELETE", 20 * time.Millisecond, nil,
				func(t *testing.T, db *sqlite.DB, path string) func() error {
					reader := otherConn(t, path, "_busy_timeout=5000")
					var mu sync.Mutex
					var ends []func() error
					t.Cleanup(func() {
						for _, end := range ends {
							end()
						}
					})
					return func() error {
						// Each run takes a new read: the batch never commits.
						return db.WriteTx(ctx, entstore.OneStatement, func(ctx context.Context, tx *sql.Tx) error {
							end, err := holdShared(ctx, reader)
							if err == nil {
								mu.Lock()
								ends = append(ends, end)
								mu.Unlock()
							}
							return err
						})
					}
				}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				db, path := openJournal(t, tc.journal, tc.busy, tc.params...)
				checker := otherConn(t, path, "_busy_timeout=5000")
				var txs sync.Map
				finish := blockedLeader(t, db)
				res := queued(t, db,
					func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("a", &txs)) },
					func() error { return db.WriteTx(ctx, entstore.OneStatement, insertBody("b", &txs)) },
					tc.fault(t, db, path),
					func() error { return db.WriteTx(ctx, entstore.Statements, insertBody("c", &txs)) },
				)
				require.NoError(t, finish())
				for i, r := range res {
					err := <-r
					require.Error(t, err, "caller %d was told its write succeeded, but the COMMIT failed", i)
					want := 19 // SQLITE_CONSTRAINT (the foreign key)
					if tc.name == "Busy/DELETE" {
						want = 5 // SQLITE_BUSY
					}
					var serr interface{ Code() int }
					require.ErrorAs(t, err, &serr)
					assert.Equal(t, want, serr.Code()&0xff, "caller %d: %v", i, err)
				}
				for _, id := range []string{"a", "b", "c"} {
					ok, err := visible(ctx, checker, id)
					require.NoError(t, err)
					assert.False(t, ok, "%s was committed", id)
				}
			})
		}
	})
}
