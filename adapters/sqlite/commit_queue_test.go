//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// TestGroupCommit_RetriedBatchMeetsAnotherWriter: between the two runs of
// a batch, another connection (another process's, as far as SQLite can
// tell) commits a lock on the resource that the batch's first run had
// acquired. The acquire is refused with the other holder named; it is
// never told of the token its first run drew.
//
// The other writer takes its turn through the processes' writer queue
// (the side file's flock, commit.go), as another process of the module
// does: it asks while the batch's first run holds the turn, and gets it
// when that run ends, before the retry, which waits for it.
func TestGroupCommit_RetriedBatchMeetsAnotherWriter(t *testing.T) {
	ctx := context.Background()
	for _, journal := range journals {
		t.Run(journal, func(t *testing.T) {
			db, path := openJournal(t, journal, 200*time.Millisecond)
			svc, err := application.NewLockService(sqlite.NewLockRepository(db), mockClock(), time.Minute)
			require.NoError(t, err)
			other := otherConn(t, path, "_txlock=immediate&_busy_timeout=5000")
			reader := otherConn(t, path, "_busy_timeout=5000")
			probe := otherConn(t, path, "_txlock=immediate&_busy_timeout=0")

			var (
				runs      atomic.Int32
				endReader = make(chan func() error, 1) // of the read the first run began
				asking    = make(chan struct{})
				wrote     = make(chan error, 1)
			)
			// The other writer: waits for its turn, ends the read that
			// keeps a rollback journal's COMMIT busy, and commits bob's
			// lock on p1.
			otherWriter := func() error {
				side, err := os.Open(path + "-lock")
				if err != nil {
					return err
				}
				defer side.Close()
				if syscall.Flock(int(side.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
					return errors.New("the batch's first run did not hold the writers' turn")
				}
				close(asking)
				if err := syscall.Flock(int(side.Fd()), syscall.LOCK_EX); err != nil {
					return err
				}
				defer syscall.Flock(int(side.Fd()), syscall.LOCK_UN)
				if err := (<-endReader)(); err != nil {
					return err
				}
				_, err = other.ExecContext(ctx, insertLockSQL, "bob", p1.ID)
				return err
			}
			fault := func() error {
				return db.WriteTx(ctx, entstore.OneStatement, func(ctx context.Context, tx *sql.Tx) error {
					if runs.Add(1) > 1 {
						return nil
					}
					go func() { wrote <- otherWriter() }()
					select {
					case <-asking:
					case err := <-wrote:
						return fmt.Errorf("the other writer: %v", err)
					}
					if journal != "WAL" {
						end, err := holdShared(ctx, reader)
						if err != nil {
							end = func() error { return nil }
						}
						endReader <- end
						return err // nil: the COMMIT stays busy until the other writer ends the read
					}
					endReader <- func() error { return nil }
					ptx, err := probe.BeginTx(ctx, nil)
					if err == nil {
						ptx.Rollback()
						return errors.New("another connection began a write while the batch held the write lock")
					}
					return err // SQLITE_BUSY: the batch runs again
				})
			}
			finish := blockedLeader(t, db)
			res := queued(t, db,
				func() error {
					l, err := svc.Acquire(ctx, "alice", p1, 0)
					if err == nil {
						return fmt.Errorf("alice was told she holds %s with token %d", p1, l.Token)
					}
					return err
				},
				fault,
			)
			require.NoError(t, finish())
			require.NoError(t, <-res[1])
			require.NoError(t, <-wrote, "the other writer")
			err = <-res[0]
			var conflict *domain.LockConflictError
			require.ErrorAs(t, err, &conflict)
			assert.Equal(t, "bob", conflict.Holder.Owner)
			assert.GreaterOrEqual(t, runs.Load(), int32(2), "the batch did not run again")
			got, err := sqlite.NewLockRepository(db).Get(ctx, p1)
			require.NoError(t, err)
			assert.Equal(t, "bob", got.Owner)
		})
	}
}
