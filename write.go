package locks

import (
	"context"
	"database/sql"
	"errors"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// appWriter runs Container.Write's transaction in the store's queue.
type appWriter func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error

var errNoWriter = errors.New("Container.Write serves the SQLite lock store, whose file has one write lock for " +
	"every writer; on PostgreSQL run the transaction on the application's own connection pool, " +
	"and on MemoryDatabase there is no SQL database to write")

// Write runs fn in a write transaction on the container's SQLite file, in
// the queue of the lock store's own writes, which the application's own
// transactions skip, keeping renewals out (docs/lifecycle.md). fn holds the
// file's only write lock: keep it short, and idempotent (it runs again on a
// busy database). It may call CheckFence on tx; a lock call in it would
// wait for fn's own transaction (refused with fn's context).
// Errors: fn's own; ctx's before the commit (changes undone);
// domain.ErrClosed once Close has begun; a *domain.StoreError when the
// transaction fails, and, of kind StoreInternal, on PostgreSQL and memory.
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

// CheckFence checks, inside tx, that f still holds, and keeps the lock
// from changing hands until tx ends: a plan store calls it for every fence
// before it writes (docs/lifecycle.md).
//
// Errors: *domain.ValidationError for a malformed fence;
// *domain.LockLostError (matching domain.ErrExpired) when the fence does
// not hold: roll tx back; *domain.StaleSnapshotError (a StoreBusy
// *domain.StoreError) when tx's snapshot is older than the lock: retry
// with BEGIN IMMEDIATE, at READ COMMITTED or with the fence first;
// *domain.StoreError when the database fails, and, of kind StoreInternal,
// on MemoryDatabase; the context's error when ctx ends.
func (c *Container) CheckFence(ctx context.Context, tx Querier, f application.Fence) error {
	return c.store.CheckFence(ctx, tx, f, c.Locks.Now(), c.Locks.Get)
}
