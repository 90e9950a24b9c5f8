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

// CheckFence is Container.CheckFence's check on SQLite, in the caller's
// transaction q (entstore.CheckFence): that f's lock is held and active
// at now, kept from changing hands until q ends.
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
