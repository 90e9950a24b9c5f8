package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// LockRepository is the lock store on SQLite: the shared store, which
// also acquires a free resource in one statement (application.OneStatement),
// an insert that the unique index refuses when the resource has a row,
// and leaves every other case to Update: the row's owner, expiry and
// token need the rule, which Update applies in Go.
//
// It is the common case made cheap. An Update that acquires a free
// resource runs a read and an insert; in a shared transaction (SQLite's
// group commit) also a savepoint around them, four statements in all. A
// single insert needs no savepoint, since a statement that fails changes
// nothing. Like Update, it reads the time inside the transaction that
// writes.
type LockRepository struct {
	*entstore.Store
	insertFree *sql.Stmt // nil on a store opened for inspection
}

var _ application.OneStatement = (*LockRepository)(nil)

// insertFreeSQL inserts a lock, which the unique index on the resource
// refuses when the resource has a row. The new lock's id is the row's
// rowid (an INTEGER PRIMARY KEY is one), which the driver reports without
// the cost of RETURNING: SQLite runs RETURNING through a temporary table,
// which made this statement twice the cost of the DELETE of a release.
//
// A refused insert changes nothing, not even the AUTOINCREMENT sequence:
// SQLite checks every unique index before it writes a row, and a failing
// statement is undone (its default ON CONFLICT ABORT) without touching
// the rest of a shared transaction. Two alternatives cost more or broke
// the tokens. ON CONFLICT DO NOTHING carries on past the refusal and
// stores the id it drew, leaving a gap in the tokens. INSERT … SELECT …
// WHERE NOT EXISTS reads the table it writes, so SQLite first copies the
// row into a temporary table and keeps a statement journal: 27% more time
// per acquire+release cycle in a batch of 16 than this insert.
// Parameters: owner, type, id, acquired_at, expires_at.
var insertFreeSQL = strings.NewReplacer(
	"{locks}", entlock.Table, "{owner}", entlock.FieldOwnerID,
	"{type}", entlock.FieldResourceType, "{rid}", entlock.FieldResourceID,
	"{acquired}", entlock.FieldAcquiredAt, "{expires}", entlock.FieldExpiresAt,
).Replace("INSERT INTO `{locks}` (`{owner}`, `{type}`, `{rid}`, `{acquired}`, `{expires}`) VALUES (?, ?, ?, ?, ?)")

// newLockRepository returns s, the store of db, with Acquire of a free
// resource in one statement.
func newLockRepository(ctx context.Context, s *entstore.Store, db *DB) (*LockRepository, error) {
	st, err := db.wsql.PrepareContext(ctx, insertFreeSQL)
	if err != nil {
		return nil, db.formatError("prepare statements", err)
	}
	return &LockRepository{Store: s, insertFree: st}, nil
}

// Close releases the prepared statements.
func (s *LockRepository) Close() error {
	if s.insertFree == nil {
		return s.Store.Close()
	}
	return errors.Join(s.insertFree.Close(), s.Store.Close())
}

// Apply implements application.OneStatement: AcquireAt for an acquire or
// a take, since it only ever inserts into a free resource, and so never
// re-enters a lock; a renewal is left to Update.
func (s *LockRepository) Apply(ctx context.Context, op application.Op) (application.Outcome, error) {
	if op.Kind != application.OpAcquire && op.Kind != application.OpTake {
		return application.Outcome{}, nil
	}
	return s.AcquireAt(ctx, op.Ref, op.Owner, op.At)
}

// AcquireAt inserts the lock if the resource has no row, and otherwise
// leaves the decision to Update (ChangeNone), as it does at once for a
// resource that was just refused (see Update).
func (s *LockRepository) AcquireAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	if s.insertFree == nil || s.Contended().Has(ref) {
		return application.Outcome{}, nil
	}
	// inserted is the outcome of one run of the write.
	type inserted struct {
		ok                bool // false: the resource has a row
		token             int64
		acquired, expires string
	}
	ins, err := entstore.WriteOne(ctx, s.Store, entstore.OneDatedStatement, func(ctx context.Context, tx *sql.Tx) (inserted, error) {
		// The time is read here, inside the transaction that writes, so
		// that a write that waited is dated when it is made.
		now, exp := at()
		in := inserted{acquired: entstore.FormatTime(now), expires: entstore.FormatTime(exp)}
		res, err := s.On(ctx, tx, s.insertFree).ExecContext(ctx,
			owner, string(ref.Type), ref.ID, in.acquired, in.expires)
		if err != nil {
			if isDuplicate(err) {
				return inserted{}, nil // the resource has a row: Update decides
			}
			return inserted{}, err
		}
		in.token, err = res.LastInsertId()
		in.ok = err == nil
		return in, err
	})
	if err != nil {
		return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
	}
	if !ins.ok {
		return application.Outcome{}, nil
	}
	l := domain.Lock{Token: ins.token, Owner: owner, Resource: ref}
	if err := entstore.ParseTimes(&l, ins.acquired, ins.expires); err != nil {
		return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
	}
	return application.Outcome{Kind: application.ChangeInsert, Lock: l}, nil
}
