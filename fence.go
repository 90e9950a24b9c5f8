package locks

import (
	"context"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
)

// Querier is the caller's transaction, in which CheckFence runs: a
// *sql.Tx, or the Tx of an Ent client generated with the sql/execquery
// feature.
type Querier = entstore.Querier

// CheckFence checks, inside tx, a transaction of the caller's on the same
// database as the locks, that f still holds: its owner still holds the
// lock with its token, unexpired at the container's clock's now. It then
// keeps that lock from changing hands until tx ends, so that whatever the
// caller writes in tx and commits was written while the lock was held.
// A plan store calls it in Persist, for every fence in order, before it
// writes (docs/lifecycle.md); entstore.CheckFence says how it works on
// each database.
//
// Errors: *domain.ValidationError for a malformed fence;
// *domain.LockLostError (matching domain.ErrExpired) when the fence does
// not hold, naming the new holder when there is one: roll tx back;
// *domain.StaleSnapshotError (a *domain.StoreError of kind StoreBusy to
// errors.As, never ErrExpired) when tx's snapshot is older than the lock:
// a SQLite deferred transaction that read before the check, a PostgreSQL
// transaction above READ COMMITTED that ran a statement before it, whose
// fence failed while the lock, read outside tx, is held: roll back and
// start again, with BEGIN IMMEDIATE, or at READ COMMITTED or the fence
// first; *domain.StoreError when the database fails (StoreBusy when
// SQLite's write lock could not be had); the context's error when ctx
// ends; a *domain.StoreError of kind StoreInternal for a container on
// MemoryDatabase.
func (c *Container) CheckFence(ctx context.Context, tx Querier, f application.Fence) error {
	return c.store.CheckFence(ctx, tx, f, c.Locks.Now(), c.Locks.Get)
}
