package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
)

// transaction is the kind of a write of the application's own (Write): a
// whole transaction, of any length, that runs alone in the queue, as a
// purge does, and in a transaction of its own.
const transaction entstore.WriteKind = -1

// runsAlone reports whether a write of kind k is never batched with others.
func runsAlone(k entstore.WriteKind) bool { return k == entstore.Cleanup || k == transaction }

// inWrite marks the context that Write passes to its function.
type inWrite struct{}

// errNestedWrite refuses a write from inside Write's function, which would
// wait for the very transaction it runs in.
var errNestedWrite = errors.New("a write of the lock store was called from inside DB.Write's function, " +
	"with its context, and would wait for that function's own transaction: " +
	"take and release locks before or after the Write, and do the transaction's writes through its tx")

// waitedBehindWrite is added to the context's error of a lock store write
// that gave up while it waited behind an application's transaction: a
// lock call from inside Write's function with another context cannot be
// told from another goroutine's, so it waits until its context ends.
const waitedBehindWrite = "it waited behind an application transaction (DB.Write, Container.Write) that was still running: " +
	"if this call was made from inside that Write's function, it was waiting for the function's own transaction, " +
	"which cannot commit until the call returns: take and release locks before or after the Write " +
	"(or pass the function's own context, and such a call is refused at once)"

// fnError carries the error of Write's function through the queue, so
// that it is returned as it is, and never read as the store's own.
type fnError struct{ err error }

func (e *fnError) Error() string { return e.err.Error() }

// Write runs fn in a write transaction of its own on the lock store's
// file, and commits it when fn returns nil (it rolls back otherwise). It
// is how an application writes its own tables in the lock file: in the
// queue of the store's writes (in arrival order, never batched) and
// behind the file lock of every process's writers (writerQueue). A write
// transaction on the application's own *sql.DB waits in SQLite's busy
// handler instead, and a stream of them can starve a lock's renewals.
//
// Every lock operation of every process waits for fn's transaction: keep
// fn short. fn may be run again when the database was busy and must start
// from nothing each time; it must not call the lock store (with fn's
// context that fails at once; with another it waits until that context
// ends, holding the write lock), nor keep tx after it returns. fn runs on
// whichever goroutine leads the queue, and its context carries ctx's
// values but not its cancellation (the driver would interrupt the shared
// connection): when ctx ends while fn runs, the transaction is rolled
// back after fn returns.
//
// Errors: fn's own error, as it returned it; the context's error when
// ctx ends before the transaction commits (its changes are then undone);
// a *domain.StoreError when the transaction fails (StoreBusy, StoreFull,
// StoreReadOnly for a store opened by OpenReadOnly, ...).
func (db *DB) Write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	const op = "application write"
	if db.wsql == nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly,
			Err: errors.New("the lock store was opened read-only (OpenReadOnly)")}
	}
	if ctx.Value(inWrite{}) != nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreInternal, Err: errNestedWrite}
	}
	err := db.commits.run(ctx, transaction, func(ctx context.Context, tx *sql.Tx) error {
		if err := fn(context.WithValue(ctx, inWrite{}, true), tx); err != nil {
			return &fnError{err: err}
		}
		return nil
	})
	var fe *fnError
	if errors.As(err, &fe) {
		return fe.err
	}
	return FormatError(op, err)
}
