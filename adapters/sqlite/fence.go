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
// transaction q (entstore.CheckFence): that f's lock is held and active at
// now, kept from changing hands until q ends.
//
// It is an UPDATE of the lock row that changes nothing but takes the write
// lock until q ends, which every change of hands needs. A deferred
// transaction with an older snapshot fails (SQLITE_BUSY). Keep q short.
//
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
