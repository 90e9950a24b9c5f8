package locks

import (
	"context"
	"errors"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Querier is the caller's transaction, in which CheckFence runs: a
// *sql.Tx, or the Tx of an Ent client generated with the sql/execquery
// feature.
type Querier = entstore.Querier

// errNoSQL is why CheckFence cannot work on a memory store.
var errNoSQL = errors.New("the locks are kept in this process's memory (MemoryDatabase), not in a SQL database: " +
	"there is no transaction to fence; open the container on the SQLite file or PostgreSQL database that holds the plans")

// fencer is what CheckFence needs to know of the container's database.
type fencer struct {
	dialect     string // Ent's name of the database; "" for memory
	formatError func(op string, err error) error
}

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
// *domain.StoreError when the database fails (StoreBusy when SQLite's
// write lock could not be had, also when tx is a deferred transaction
// whose earlier reads are out of date, or a PostgreSQL transaction above
// READ COMMITTED whose snapshot is: roll back and start again); the
// context's error when ctx ends; a *domain.StoreError of kind
// StoreInternal for a container on MemoryDatabase.
func (c *Container) CheckFence(ctx context.Context, tx Querier, f application.Fence) error {
	const op = "fenced write"
	if c.fence.dialect == "" {
		return &domain.StoreError{Op: op, Kind: domain.StoreInternal, Err: errNoSQL}
	}
	if err := entstore.CheckFence(ctx, tx, c.fence.dialect, f, c.Locks.Now()); err != nil {
		return entstore.Explain(ctx, err, op, c.fence.formatError)
	}
	return nil
}
