package sqlite

import (
	"context"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// CheckFence checks, inside the caller's transaction q on the database of
// the locks, that f.Owner still holds the lock on f.Resource with token
// f.Token and that it has not expired at now (the lock service's clock:
// active while now < expires_at), and keeps that lock from changing hands
// until q ends. The caller then writes what the lock protects in the same
// transaction and commits: the write lands while the lock is held, or not
// at all.
//
// The check is one UPDATE of the lock row that changes nothing but must
// match id, owner, resource and an unexpired expires_at. Running it takes
// the database's write lock, held until q ends, and every change of hands
// (takeover, release, cleanup) is a write, so none can come between the
// check and the commit. A deferred transaction that already read an older
// snapshot cannot take the write lock: the UPDATE fails (SQLITE_BUSY),
// never succeeds on what it read. Keep q short: it holds the only write
// lock, and every lock operation waits for it.
//
// Errors: those of entstore.CheckFence.
func CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time) error {
	return entstore.CheckFence(ctx, q, dialect.SQLite, f, now, fenceHolds)
}

// fenceHolds runs the check and reports whether the fence holds.
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
