package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/ent"
	entlock "github.com/cleveragents/locks/ent/lock"
	"github.com/cleveragents/locks/ent/predicate"
)

// errNoRow reports a Decide function that asked to extend a lock that
// does not exist: a bug in the caller, not a state of the store.
var errNoRow = errors.New("no lock to extend")

var _ application.LockRepository = (*LockRepository)(nil)

// LockRepository implements application.LockRepository on a DB.
type LockRepository struct {
	db        *DB
	contended contention
}

// NewLockRepository returns the repository of db.
func NewLockRepository(db *DB) *LockRepository { return &LockRepository{db: db} }

// Update implements application.LockRepository. The read and the write
// share one immediate transaction, so no other writer, in this process or
// another, can slip in between.
//
// A refusal needs no write, and a resource that was just refused is likely
// to be refused again: for those the decision is first taken on a plain
// read, which WAL serves without waiting for the writer. Pollers of a held
// lock then neither queue behind the holder's release nor make SQLite's
// sleeping busy handler arbitrate between processes. The refusal is exact:
// the lock it names was stored and active at the read. Anything else is
// decided again under the write lock.
func (r *LockRepository) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	if r.contended.has(ref) {
		cur, err := r.db.readLock(ctx, ref)
		if err != nil {
			return domain.Lock{}, FormatError("read lock on "+ref.String(), err)
		}
		if _, err := decide(cur); errors.Is(err, domain.ErrConflict) {
			return domain.Lock{}, err
		}
	}
	var out domain.Lock
	err := r.db.inTx(ctx, "update lock on "+ref.String(), func(ctx context.Context, tx *sql.Tx) error {
		cur, err := scanLock(tx.StmtContext(ctx, r.db.stmts.sel).QueryRowContext(ctx, string(ref.Type), ref.ID))
		if err != nil {
			return err
		}
		change, err := decide(cur)
		r.contended.note(ref, errors.Is(err, domain.ErrConflict))
		if err != nil {
			return err
		}
		out, err = r.apply(ctx, tx, ref, cur, change)
		return err
	})
	return out, err
}

// apply writes change inside tx and returns the lock as stored.
func (r *LockRepository) apply(ctx context.Context, tx *sql.Tx, ref domain.ResourceRef, cur *domain.Lock, change application.Change) (domain.Lock, error) {
	switch change.Kind {
	case application.ChangeExtend:
		if cur == nil {
			return domain.Lock{}, &domain.StoreError{Op: "extend lock", Err: errNoRow}
		}
		if _, err := tx.StmtContext(ctx, r.db.stmts.extend).ExecContext(ctx, formatTime(change.Lock.ExpiresAt), cur.Token); err != nil {
			return domain.Lock{}, err
		}
		l := *cur
		l.ExpiresAt = change.Lock.ExpiresAt
		return l, nil
	case application.ChangeInsert:
		// A change of hands inserts a new row, so the lock gets a new
		// AUTOINCREMENT id: its fencing token, never reused.
		if cur != nil {
			if _, err := tx.StmtContext(ctx, r.db.stmts.delID).ExecContext(ctx, cur.Token); err != nil {
				return domain.Lock{}, err
			}
		}
		l := change.Lock
		l.Resource = ref
		err := tx.StmtContext(ctx, r.db.stmts.insert).QueryRowContext(ctx,
			l.Owner, string(ref.Type), ref.ID, formatTime(l.AcquiredAt), formatTime(l.ExpiresAt)).Scan(&l.Token)
		return l, err
	}
	if cur == nil {
		return domain.Lock{}, nil
	}
	return *cur, nil
}

// Get implements application.LockRepository.
func (r *LockRepository) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	cur, err := r.db.readLock(ctx, ref)
	switch {
	case err != nil:
		return domain.Lock{}, FormatError("get lock on "+ref.String(), err)
	case cur == nil:
		return domain.Lock{}, domain.ErrNotFound
	}
	return *cur, nil
}

// List implements application.LockRepository.
func (r *LockRepository) List(ctx context.Context, f application.ListFilter) ([]domain.Lock, error) {
	q := r.db.client.Lock.Query()
	if f.Type != "" {
		q = q.Where(entlock.ResourceType(string(f.Type)))
	}
	if f.Owner != "" {
		q = q.Where(entlock.OwnerID(f.Owner))
	}
	if !f.ActiveAt.IsZero() {
		q = q.Where(entlock.ExpiresAtGT(formatTime(f.ActiveAt)))
	}
	rows, err := q.Order(ent.Asc(entlock.FieldResourceType), ent.Asc(entlock.FieldResourceID)).All(ctx)
	if err != nil {
		return nil, FormatError("list locks", err)
	}
	out := make([]domain.Lock, 0, len(rows))
	for _, row := range rows {
		l, err := toDomain(row)
		if err != nil {
			return nil, FormatError("list locks", err)
		}
		out = append(out, l)
	}
	return out, nil
}

// DeleteOwned implements application.LockRepository with one statement.
func (r *LockRepository) DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error) {
	var n int64
	err := r.db.write(ctx, "release lock on "+ref.String(), func(ctx context.Context) error {
		res, err := r.db.stmts.delOwned.ExecContext(ctx, string(ref.Type), ref.ID, owner)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	return n > 0, err
}

// DeleteAllOwned implements application.LockRepository.
func (r *LockRepository) DeleteAllOwned(ctx context.Context, owner string) (int, error) {
	var n int
	err := r.db.write(ctx, "release locks of "+owner, func(ctx context.Context) (err error) {
		n, err = r.db.wclient.Lock.Delete().Where(entlock.OwnerID(owner)).Exec(ctx)
		return err
	})
	return n, err
}

// DeleteExpired implements application.LockRepository: one short write
// that removes at most limit expired rows, found through the expires_at
// index.
func (r *LockRepository) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	var n int
	err := r.db.write(ctx, "clean up expired locks", func(ctx context.Context) (err error) {
		n, err = r.db.wclient.Lock.Delete().
			Where(oldestExpired(now, limit)).
			Exec(ctx)
		return err
	})
	return n, err
}

// CountExpired implements application.LockRepository.
func (r *LockRepository) CountExpired(ctx context.Context, now time.Time) (int, error) {
	n, err := r.db.client.Lock.Query().Where(expiredAt(now)).Count(ctx)
	return n, FormatError("count expired locks", err)
}

func byResource(ref domain.ResourceRef) predicate.Lock {
	return entlock.And(entlock.ResourceType(string(ref.Type)), entlock.ResourceID(ref.ID))
}

// expiredAt matches the rows that have expired at now: the same rule as
// domain.Lock.ExpiredAt, in SQL.
func expiredAt(now time.Time) predicate.Lock {
	return entlock.ExpiresAtLTE(formatTime(now))
}

// oldestExpired matches at most limit expired rows, oldest first, as a
// subquery on the expires_at index: SQLite has no DELETE ... LIMIT by
// default.
func oldestExpired(now time.Time, limit int) predicate.Lock {
	return func(s *entsql.Selector) {
		batch := entsql.Select(entlock.FieldID).
			From(entsql.Table(entlock.Table)).
			Where(entsql.LTE(entlock.FieldExpiresAt, formatTime(now))).
			OrderBy(entlock.FieldExpiresAt).
			Limit(limit)
		s.Where(entsql.In(s.C(entlock.FieldID), batch))
	}
}

func toDomain(row *ent.Lock) (domain.Lock, error) {
	acquired, err := parseTime(entlock.FieldAcquiredAt, row.AcquiredAt)
	if err != nil {
		return domain.Lock{}, &domain.StoreError{Op: "read lock", Kind: domain.StoreCorrupt, Err: err}
	}
	expires, err := parseTime(entlock.FieldExpiresAt, row.ExpiresAt)
	if err != nil {
		return domain.Lock{}, &domain.StoreError{Op: "read lock", Kind: domain.StoreCorrupt, Err: err}
	}
	return domain.Lock{
		Token:      row.ID,
		Owner:      row.OwnerID,
		Resource:   domain.ResourceRef{Type: domain.ResourceType(row.ResourceType), ID: row.ResourceID},
		AcquiredAt: acquired,
		ExpiresAt:  expires,
	}, nil
}
