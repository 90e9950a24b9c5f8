package locks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"entgo.io/ent/dialect"

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
	check       func(ctx context.Context, q Querier, f application.Fence, now time.Time) error
	stale       func(f application.Fence, isolation string, held *domain.Lock, cause error) *domain.StaleSnapshotError
	formatError func(op string, err error) error
	// snapshotConflict reports a refusal of the check because the caller's
	// transaction's snapshot is older than a change of the lock; nil
	// where the database has no such refusal.
	snapshotConflict func(error) bool
}

// CheckFence checks, inside tx, a transaction of the caller's on the same
// database as the locks, that f still holds: its owner still holds the
// lock with its token, unexpired at the container's clock's now. It then
// keeps that lock from changing hands until tx ends, so that whatever the
// caller writes in tx and commits was written while the lock was held.
// A plan store calls it in Persist, for every fence in order, before it
// writes (docs/lifecycle.md); the adapters' CheckFence say how it works
// on each database.
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
	const op = "fenced write"
	if c.fence.dialect == "" {
		return &domain.StoreError{Op: op, Kind: domain.StoreInternal, Err: errNoSQL}
	}
	now := c.Locks.Now()
	err := c.fence.check(ctx, tx, f, now)
	if err == nil {
		return nil
	}
	var stale *domain.StaleSnapshotError
	if errors.As(err, &stale) || (c.fence.snapshotConflict != nil && c.fence.snapshotConflict(err)) {
		return c.explainStale(ctx, f, now, err)
	}
	return entstore.Explain(ctx, err, op, c.fence.formatError)
}

// explainStale explains a fence that failed on the old snapshot of the
// caller's transaction (PostgreSQL above READ COMMITTED, a SQLite
// deferred transaction that read first), from the lock
// as committed now, read outside the transaction: a held lock gives a
// StaleSnapshotError that says so (retry), a lost one the LockLostError
// of what happened to it. The fence failed either way: the transaction
// must not write.
func (c *Container) explainStale(ctx context.Context, f application.Fence, now time.Time, err error) error {
	var (
		cause     error
		isolation string
		stale     *domain.StaleSnapshotError
	)
	if errors.As(err, &stale) {
		isolation = stale.Isolation
	} else {
		cause = err // the database's refusal
	}
	cur, gerr := c.Locks.Get(ctx, f.Resource)
	switch {
	case gerr == nil && cur.Token == f.Token && cur.Owner == f.Owner && now.Before(cur.ExpiresAt):
		if c.fence.dialect == dialect.SQLite {
			return c.sqliteStale(f, &cur, err)
		}
		return c.fence.stale(f, isolation, &cur, cause)
	case gerr == nil:
		return entstore.FenceLost(f, &cur, now)
	case errors.Is(gerr, domain.ErrNotFound):
		return entstore.FenceLost(f, nil, now)
	case ctx.Err() != nil:
		return entstore.Explain(ctx, err, "fenced write", c.fence.formatError)
	}
	if c.fence.dialect == dialect.SQLite {
		stale = c.sqliteStale(f, nil, err)
	} else {
		stale = c.fence.stale(f, isolation, nil, cause)
	}
	stale.Err = errors.Join(cause, fmt.Errorf("reading the lock outside the transaction: %w", gerr))
	return stale
}

// sqliteStale is SQLite's refusal of the fence of a deferred transaction
// that read first (SQLITE_BUSY_SNAPSHOT, in err), which says what the
// lock, read outside the transaction, is: held, or unknown (nil).
func (c *Container) sqliteStale(f application.Fence, held *domain.Lock, err error) *domain.StaleSnapshotError {
	var stale *domain.StaleSnapshotError
	if !errors.As(c.fence.formatError("check a fence", err), &stale) {
		stale = &domain.StaleSnapshotError{Op: "check a fence", What: "the transaction's snapshot is out of date", Err: err}
	}
	lock := fmt.Sprintf("the lock of owner %q on %s (token %d)", f.Owner, f.Resource, f.Token)
	if held != nil {
		stale.Held = true
		stale.What = fmt.Sprintf("%s is held (until %s), but the fence cannot take SQLite's write lock: %s",
			lock, held.ExpiresAt.UTC().Format(time.RFC3339Nano), stale.What)
	} else {
		stale.What = fmt.Sprintf("%s may be held, but the fence cannot take SQLite's write lock: %s", lock, stale.What)
	}
	return stale
}
