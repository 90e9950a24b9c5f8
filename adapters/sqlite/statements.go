package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// The hot path (acquire, renew, release) runs these statements, prepared
// once per connection. Ent writes their text from the generated schema, so
// a renamed column breaks the build rather than a query; Ent's query layer
// is not used for them because it cost 40-45% on top of SQLite for each
// acquire+release cycle (docs/performance.md), where the service is meant
// to cost at most 25% more than hand-written database/sql.
var (
	sqlSelect, sqlInsert, sqlExtend, sqlDeleteID, sqlDeleteOwned = buildStatements()
)

func buildStatements() (sel, ins, ext, delID, delOwned string) {
	b := entsql.Dialect(dialect.SQLite)
	byResource := entsql.And(entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""))
	sel, _ = b.Select(entlock.Columns...).From(entsql.Table(entlock.Table)).Where(byResource).Query()
	ins, _ = b.Insert(entlock.Table).
		Columns(entlock.FieldOwnerID, entlock.FieldResourceType, entlock.FieldResourceID, entlock.FieldAcquiredAt, entlock.FieldExpiresAt).
		Values("", "", "", "", "").
		Returning(entlock.FieldID).
		Query()
	ext, _ = b.Update(entlock.Table).Set(entlock.FieldExpiresAt, "").Where(entsql.EQ(entlock.FieldID, 0)).Query()
	delID, _ = b.Delete(entlock.Table).Where(entsql.EQ(entlock.FieldID, 0)).Query()
	delOwned, _ = b.Delete(entlock.Table).
		Where(entsql.And(
			entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""),
			entsql.EQ(entlock.FieldOwnerID, ""))).
		Query()
	return
}

// stmts are the prepared hot-path statements of one DB.
type stmts struct {
	read                                 *sql.Stmt // sqlSelect, on the readers
	sel, insert, extend, delID, delOwned *sql.Stmt // on the writer
}

func (db *DB) prepare(ctx context.Context) error {
	var err error
	prep := func(on *sql.DB, query string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var s *sql.Stmt
		s, err = on.PrepareContext(ctx, query)
		return s
	}
	db.stmts.read = prep(db.sql, sqlSelect)
	if db.wsql != nil { // not on a read-only handle
		db.stmts.sel = prep(db.wsql, sqlSelect)
		db.stmts.insert = prep(db.wsql, sqlInsert)
		db.stmts.extend = prep(db.wsql, sqlExtend)
		db.stmts.delID = prep(db.wsql, sqlDeleteID)
		db.stmts.delOwned = prep(db.wsql, sqlDeleteOwned)
	}
	return err
}

// readLock reads the lock on ref outside any transaction, or nil.
func (db *DB) readLock(ctx context.Context, ref domain.ResourceRef) (*domain.Lock, error) {
	if db.stmts.read == nil { // a read-only handle prepares nothing
		return scanLock(db.sql.QueryRowContext(ctx, sqlSelect, string(ref.Type), ref.ID))
	}
	return scanLock(db.stmts.read.QueryRowContext(ctx, string(ref.Type), ref.ID))
}

// scanLock reads one row of sqlSelect, or returns nil when there is none.
func scanLock(row *sql.Row) (*domain.Lock, error) {
	var (
		l                 domain.Lock
		typ               string
		acquired, expires string
	)
	err := row.Scan(&l.Token, &l.Owner, &typ, &l.Resource.ID, &acquired, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l.Resource.Type = domain.ResourceType(typ)
	if l.AcquiredAt, err = parseTime(entlock.FieldAcquiredAt, acquired); err != nil {
		return nil, &domain.StoreError{Op: "read lock", Kind: domain.StoreCorrupt, Err: err}
	}
	if l.ExpiresAt, err = parseTime(entlock.FieldExpiresAt, expires); err != nil {
		return nil, &domain.StoreError{Op: "read lock", Kind: domain.StoreCorrupt, Err: err}
	}
	return &l, nil
}
