package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
	"github.com/cleveragents/locks/internal/backend"
)

// SQLite is the database locks.Open opens for every name that is not a
// PostgreSQL DSN or MemoryDatabase; the root package always links it.
func init() { backend.Register(backend.SQLite, openStore) }

// store is a SQLite file as the container uses it.
type store struct {
	db    *DB
	clock application.Clock
}

func openStore(ctx context.Context, opts backend.Options) (backend.Store, error) {
	db, err := Open(ctx, opts.Database, Options{BusyTimeout: opts.BusyTimeout, Owner: opts.Owner})
	if err != nil {
		return nil, err
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.New()
	}
	return &store{db: db, clock: clk}, nil
}

func (s *store) Repository() application.LockRepository { return NewLockRepository(s.db) }
func (s *store) Clock() application.Clock               { return s.clock }
func (s *store) Wakeups() application.Wakeups           { return s.db.Wakeups() }
func (s *store) Close(context.Context) error            { return s.db.Close() }

// Writer is DB.Write, which queues with the store's writes.
func (s *store) Writer() func(ctx context.Context, fn func(context.Context, *sql.Tx) error) error {
	return s.db.Write
}

// CheckFence checks f in q (CheckFence), explaining a stale snapshot.
func (s *store) CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time, read backend.ReadLock) error {
	err := CheckFence(ctx, q, f, now)
	switch {
	case err == nil:
		return nil
	case SnapshotConflict(err):
		return entstore.ExplainStale(ctx, err, f, now, read, FormatError, func(held *domain.Lock, _ string, cause error) *domain.StaleSnapshotError {
			return staleFence(f, held, cause)
		})
	}
	return entstore.Explain(ctx, err, "fenced write", FormatError)
}

// staleFence is the refusal (SQLITE_BUSY_SNAPSHOT, in err) of the fence of
// a deferred transaction that read first, saying whether the lock, read
// outside it, is held, or unknown (nil).
func staleFence(f application.Fence, held *domain.Lock, err error) *domain.StaleSnapshotError {
	var stale *domain.StaleSnapshotError
	if !errors.As(FormatError("check a fence", err), &stale) {
		stale = &domain.StaleSnapshotError{Op: "check a fence", What: "the transaction's snapshot is out of date", Err: err}
	}
	state := "may be held"
	if held != nil {
		stale.Held = true
		state = "is held (until " + held.ExpiresAt.UTC().Format(time.RFC3339Nano) + ")"
	}
	stale.What = fmt.Sprintf("the lock of owner %q on %s (token %d) %s, but the fence cannot take SQLite's write lock: %s",
		f.Owner, f.Resource, f.Token, state, stale.What)
	return stale
}

// CheckFence is Container.CheckFence's check on SQLite, in the caller's
// transaction q (entstore.CheckFence): an UPDATE of the lock row that changes
// nothing but holds the write lock, which every change of hands needs, until
// q ends. A deferred q with an older snapshot fails (SQLITE_BUSY): keep q short.
// Errors: those of entstore.CheckFence.
func CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time) error {
	return entstore.CheckFence(ctx, q, dialect.SQLite, f, now, fenceHolds)
}

func fenceHolds(ctx context.Context, q entstore.Querier, f application.Fence, now string) (bool, error) {
	query, args := entsql.Dialect(dialect.SQLite).Update(entlock.Table).
		Set(entlock.FieldOwnerID, entsql.ExprFunc(func(b *entsql.Builder) { b.Ident(entlock.FieldOwnerID) })).
		Where(entsql.And(
			entsql.EQ(entlock.FieldID, f.Token),
			entsql.EQ(entlock.FieldOwnerID, f.Owner),
			entsql.EQ(entlock.FieldResourceType, string(f.Resource.Type)),
			entsql.EQ(entlock.FieldResourceID, f.Resource.ID),
			entsql.GT(entlock.FieldExpiresAt, now),
		)).
		Query()
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}
