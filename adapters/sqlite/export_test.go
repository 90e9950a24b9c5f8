package sqlite

import (
	"context"
	"database/sql"
	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
)

// WriteTx runs body as a write of the store, through group commit, for
// tests that need to hold a transaction open or see who shares it.
func (db *DB) WriteTx(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
	return db.commits.run(ctx, kind, body)
}

// Queued returns how many writes wait for the next transaction.
func Queued(db *DB) int {
	db.commits.mu.Lock()
	defer db.commits.mu.Unlock()
	return len(db.commits.queue)
}

// Writer returns the writing connection, on which a write that runs alone
// outside a transaction (its tx is nil) runs its statement.
func (db *DB) Writer() *sql.DB { return db.wsql }

// WriterCheckpointFrames returns the most frames that the last step of a
// checkpoint, on the writing connection, has copied so far.
func WriterCheckpointFrames(db *DB) int64 { return db.checkpoints.writerCopied.Load() }

// HoldBack is the pause of a process whose last turn to write had to wait.
var HoldBack = holdBack

// WaitCheckpoint waits for the checkpoint under way, if any.
func WaitCheckpoint(db *DB) { db.checkpoints.wg.Wait() }

// Flushes returns how many times the checkpoints synced the file system
// beside a purge.
func Flushes(db *DB) int64 { return db.checkpoints.flushes.Load() }

// CatchUpAfter returns how many writes the next checkpoint waits for.
func CatchUpAfter(db *DB) int {
	db.checkpoints.mu.Lock()
	defer db.checkpoints.mu.Unlock()
	return db.checkpoints.after
}

// The checkpoints' spacing: what it is under ordinary writes, and its
// least.
const (
	CheckpointAfter = checkpointAfter
	MinAfter        = minAfter
)

// NextAfter is how the spacing follows the frames a write adds.
var NextAfter = nextAfter

// Freed tells the other processes on db's file that the lock on ref came
// free, as a release through db does after its commit.
func Freed(db *DB, ref domain.ResourceRef) { db.wake.freed(ref) }

// Readers returns the pool of reading connections.
func (db *DB) Readers() *sql.DB { return db.sql }

// FreedAll is a release-all's wake-up: every resource may have come free.
func FreedAll(db *DB) { db.wake.freed() }
