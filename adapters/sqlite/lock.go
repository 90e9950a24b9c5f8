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

// LockRepository is the lock store on SQLite: the shared store, which also
// acquires a free resource in one statement (application.OneStatement),
// where Update needs four; every other case is left to Update.
type LockRepository struct {
	*entstore.Store
	insertFree *sql.Stmt // nil on a store opened for inspection
}

var _ application.OneStatement = (*LockRepository)(nil)

// insertFreeSQL inserts a lock, which the unique index refuses when the
// resource has a row, changing nothing (not even the AUTOINCREMENT sequence,
// where ON CONFLICT DO NOTHING would leave a gap in the tokens). The token is
// the rowid, read without RETURNING, which doubles SQLite's cost.
var insertFreeSQL = strings.NewReplacer(
	"{locks}", entlock.Table, "{owner}", entlock.FieldOwnerID,
	"{type}", entlock.FieldResourceType, "{rid}", entlock.FieldResourceID,
	"{acquired}", entlock.FieldAcquiredAt, "{expires}", entlock.FieldExpiresAt, "{note}", entlock.FieldNote,
).Replace("INSERT INTO `{locks}` (`{owner}`, `{type}`, `{rid}`, `{acquired}`, `{expires}`, `{note}`) VALUES (?, ?, ?, ?, ?, ?)")

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

// Apply implements application.OneStatement: AcquireAt for an acquire or a
// take, which it only ever inserts into a free resource; not a renewal.
func (s *LockRepository) Apply(ctx context.Context, op application.Op) (application.Outcome, error) {
	if op.Kind != application.OpAcquire && op.Kind != application.OpTake {
		return application.Outcome{}, nil
	}
	return s.acquireAt(ctx, op.Ref, op.Owner, op.Note, op.At)
}

// AcquireAt inserts the lock if the resource has no row, and otherwise
// leaves it to Update (ChangeNone), at once for one just refused.
func (s *LockRepository) AcquireAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.acquireAt(ctx, ref, owner, "", at)
}

// acquireAt is AcquireAt storing note with the lock.
func (s *LockRepository) acquireAt(ctx context.Context, ref domain.ResourceRef, owner, note string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	if s.insertFree == nil || s.Contended().Has(ref) {
		return application.Outcome{}, nil
	}
	type inserted struct { // the outcome of one run of the write
		ok                bool // false: the resource has a row
		token             int64
		acquired, expires string
	}
	ins, err := entstore.WriteOne(ctx, s.Store, entstore.OneDatedStatement, func(ctx context.Context, tx *sql.Tx) (inserted, error) {
		now, exp := at() // inside the transaction: a write that waited is dated when made
		in := inserted{acquired: entstore.FormatTime(now), expires: entstore.FormatTime(exp)}
		res, err := s.On(ctx, tx, s.insertFree).ExecContext(ctx,
			owner, string(ref.Type), ref.ID, in.acquired, in.expires, entstore.NoteValue(note))
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
	l := domain.Lock{Token: ins.token, Owner: owner, Resource: ref, Note: note}
	if err := entstore.ParseTimes(&l, ins.acquired, ins.expires); err != nil {
		return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
	}
	return application.Outcome{Kind: application.ChangeInsert, Lock: l}, nil
}
