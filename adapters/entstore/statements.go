package entstore

import (
	"context"
	"database/sql"
	"errors"

	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// The hot path (acquire, renew, release) runs these statements, prepared
// once. Ent's builder writes their text, so that a renamed column breaks
// the build; Ent's query layer cost 45-90% more per acquire+release cycle
// than database/sql (docs/performance.md).

// statementText is the SQL of the hot path in one dialect.
type statementText struct {
	sel, insert, extend, delID, delOwned, delToken string
}

func buildStatements(dialectName string) (t statementText) {
	b := entsql.Dialect(dialectName)
	byResource := entsql.And(entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""))
	t.sel, _ = b.Select(entlock.Columns...).From(b.Table(entlock.Table)).Where(byResource).Query()
	t.insert, _ = b.Insert(entlock.Table).
		Columns(entlock.FieldOwnerID, entlock.FieldResourceType, entlock.FieldResourceID, entlock.FieldAcquiredAt, entlock.FieldExpiresAt).
		Values("", "", "", "", "").
		Returning(entlock.FieldID).
		Query()
	// extend and delID name the row version read (id and expiry), so that
	// they never apply a decision to a row that changed since.
	thisVersion := entsql.And(entsql.EQ(entlock.FieldID, 0), entsql.EQ(entlock.FieldExpiresAt, ""))
	t.extend, _ = b.Update(entlock.Table).Set(entlock.FieldExpiresAt, "").Where(thisVersion).Query()
	t.delID, _ = b.Delete(entlock.Table).Where(thisVersion).Query()
	t.delOwned, _ = b.Delete(entlock.Table).
		Where(entsql.And(
			entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""),
			entsql.EQ(entlock.FieldOwnerID, ""))).
		Query()
	// delToken is a handle's release: its own acquisition (the token),
	// and only while it is active, so that a handle that lost its lock
	// removes nothing, and learns so.
	t.delToken, _ = b.Delete(entlock.Table).
		Where(entsql.And(
			entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""),
			entsql.EQ(entlock.FieldID, 0), entsql.GT(entlock.FieldExpiresAt, ""))).
		Query()
	return
}

// stmts are the prepared hot-path statements of one Store.
type stmts struct {
	read                                           *sql.Stmt // sel, on the readers
	sel, insert, extend, delID, delOwned, delToken *sql.Stmt // on the writer
}

func (s *Store) prepare(ctx context.Context) (err error) {
	prep := func(on *sql.DB, query string) (st *sql.Stmt) {
		if err == nil {
			st, err = on.PrepareContext(ctx, query)
		}
		return st
	}
	t := s.text
	s.stmts = stmts{
		read:     prep(s.read, t.sel),
		sel:      prep(s.write, t.sel),
		insert:   prep(s.write, t.insert),
		extend:   prep(s.write, t.extend),
		delID:    prep(s.write, t.delID),
		delOwned: prep(s.write, t.delOwned),
		delToken: prep(s.write, t.delToken),
	}
	return err
}

// ReadLock reads the lock on ref outside any transaction, or nil. It
// returns the database's error as it is.
func (s *Store) ReadLock(ctx context.Context, ref domain.ResourceRef) (*domain.Lock, error) {
	if s.stmts.read == nil { // a read-only store prepares nothing
		return scanLock(s.read.QueryRowContext(ctx, s.text.sel, string(ref.Type), ref.ID))
	}
	return scanLock(s.stmts.read.QueryRowContext(ctx, string(ref.Type), ref.ID))
}

// scanLock reads one row of the lock's columns (a *sql.Row or the current
// row of *sql.Rows), or returns nil when there is none.
func scanLock(row interface{ Scan(dest ...any) error }) (*domain.Lock, error) {
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
	if err := ParseTimes(&l, acquired, expires); err != nil {
		return nil, err
	}
	return &l, nil
}
