package locks

import (
	"context"
	"database/sql"
	"errors"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// appWriter runs an application's write transaction in the lock store's
// queue of writers; nil for a store that has none.
type appWriter func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error

var errNoWriter = errors.New("Container.Write serves the SQLite lock store, whose file has one write lock for " +
	"every writer; on PostgreSQL run the transaction on the application's own connection pool, " +
	"and on MemoryDatabase there is no SQL database to write")

// Write runs fn in a write transaction on the container's SQLite file, and
// commits it when fn returns nil: the way to write the application's own
// tables in the file that holds the locks. The transaction joins the queue
// of the store's own writes, in this process and across processes, so that
// a stream of application writes cannot keep the store's renewals out
// until a kept-alive lock expires, as transactions on the application's
// own *sql.DB, waiting in SQLite's busy handler, can (docs/lifecycle.md).
//
// fn runs holding the file's only write lock, on whichever goroutine leads
// the queue, with ctx's values but not its cancellation: keep it short,
// and let it start from nothing each time, since it may run again when the
// database was busy. It may call CheckFence on tx, but must not take or
// release locks, which would wait for fn's own transaction: with the
// context fn is given such a call is refused (a *domain.StoreError); with
// any other it waits until that context ends, or forever, while every
// lock operation of every process waits too.
//
// Errors: fn's own error; ctx's error when ctx ends before the commit
// (the changes are undone); domain.ErrClosed once Close has begun; a
// *domain.StoreError when the transaction fails (StoreBusy, StoreFull,
// ...) and, of kind StoreInternal, on PostgreSQL and MemoryDatabase.
func (c *Container) Write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if c.write == nil {
		return &domain.StoreError{Op: "application write", Kind: domain.StoreInternal, Err: errNoWriter}
	}
	if c.closing.Load() {
		return domain.ErrClosed
	}
	err := c.write(ctx, fn)
	if err != nil && c.closing.Load() && domain.IsStoreKind(err, domain.StoreInternal) {
		return errors.Join(domain.ErrClosed, err) // the store closed under it
	}
	return err
}

// Querier is the caller's transaction, in which CheckFence runs: a
// *sql.Tx, or the Tx of an Ent client generated with sql/execquery.
type Querier = entstore.Querier

// CheckFence checks, inside tx, the caller's transaction on the locks'
// database, that f still holds at the container's clock's now, and keeps
// the lock from changing hands until tx ends, so that what tx commits was
// written under the lock. A plan store calls it in Persist for every
// fence, in order, before it writes (docs/lifecycle.md).
//
// Errors: *domain.ValidationError for a malformed fence;
// *domain.LockLostError (matching domain.ErrExpired) when the fence does
// not hold: roll tx back; *domain.StaleSnapshotError (a StoreBusy
// *domain.StoreError, never ErrExpired) when tx read a snapshot older than
// the lock, which is still held (a SQLite deferred transaction, or a
// PostgreSQL one above READ COMMITTED, that read first): roll back and
// retry with BEGIN IMMEDIATE, at READ COMMITTED or the fence first;
// *domain.StoreError when the database fails (StoreBusy when SQLite's
// write lock could not be had), and, of kind StoreInternal, on
// MemoryDatabase; the context's error when ctx ends.
func (c *Container) CheckFence(ctx context.Context, tx Querier, f application.Fence) error {
	return c.store.CheckFence(ctx, tx, f, c.Locks.Now(), c.Locks.Get)
}
