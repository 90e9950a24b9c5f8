package sqlite

import (
	"context"
	"errors"
	"time"

	"entgo.io/ent/dialect/sql"

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
	db *DB
}

// NewLockRepository returns the repository of db.
func NewLockRepository(db *DB) *LockRepository { return &LockRepository{db: db} }

// Update implements application.LockRepository. The read and the write
// share one immediate transaction, so no other writer, in this process or
// another, can slip in between.
func (r *LockRepository) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	// A refusal needs no write. Deciding first on a plain read (which WAL
	// serves without waiting for the writer) lets callers that poll a held
	// lock be refused without queueing behind, and delaying, the holder's
	// release. The refusal is exact: the lock it names was stored and
	// active at the read. Anything else is decided again under the write lock.
	if row, err := r.db.client.Lock.Query().Where(byResource(ref)).Only(ctx); err == nil {
		if cur, err := toDomain(row); err == nil {
			if _, err := decide(&cur); err != nil {
				return domain.Lock{}, err
			}
		}
	}
	var out domain.Lock
	err := r.db.inTx(ctx, "update lock on "+ref.String(), func(ctx context.Context, tx *ent.Tx) error {
		out = domain.Lock{}
		row, err := tx.Lock.Query().Where(byResource(ref)).Only(ctx)
		var cur *domain.Lock
		switch {
		case ent.IsNotFound(err):
		case err != nil:
			return err
		default:
			l, err := toDomain(row)
			if err != nil {
				return err
			}
			cur = &l
		}
		change, err := decide(cur)
		if err != nil {
			return err
		}
		switch change.Kind {
		case application.ChangeNone:
			if cur != nil {
				out = *cur
			}
		case application.ChangeExtend:
			if cur == nil {
				return &domain.StoreError{Op: "extend lock", Err: errNoRow}
			}
			if err := tx.Lock.UpdateOneID(cur.Token).SetExpiresAt(formatTime(change.Lock.ExpiresAt)).Exec(ctx); err != nil {
				return err
			}
			out = *cur
			out.ExpiresAt = change.Lock.ExpiresAt
		case application.ChangeInsert:
			// A change of hands inserts a new row, so the lock gets a new
			// AUTOINCREMENT id: its fencing token, never reused.
			if cur != nil {
				if err := tx.Lock.DeleteOneID(cur.Token).Exec(ctx); err != nil {
					return err
				}
			}
			l := change.Lock
			created, err := tx.Lock.Create().
				SetOwnerID(l.Owner).
				SetResourceType(string(ref.Type)).
				SetResourceID(ref.ID).
				SetAcquiredAt(formatTime(l.AcquiredAt)).
				SetExpiresAt(formatTime(l.ExpiresAt)).
				Save(ctx)
			if err != nil {
				return err
			}
			l.Token, l.Resource = created.ID, ref
			out = l
		}
		return nil
	})
	return out, err
}

// Get implements application.LockRepository.
func (r *LockRepository) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	row, err := r.db.client.Lock.Query().Where(byResource(ref)).Only(ctx)
	if ent.IsNotFound(err) {
		return domain.Lock{}, domain.ErrNotFound
	}
	if err != nil {
		return domain.Lock{}, FormatError("get lock on "+ref.String(), err)
	}
	l, err := toDomain(row)
	return l, FormatError("get lock on "+ref.String(), err)
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
	var n int
	err := r.db.write(ctx, "release lock on "+ref.String(), func(ctx context.Context) (err error) {
		n, err = r.db.wclient.Lock.Delete().Where(byResource(ref), entlock.OwnerID(owner)).Exec(ctx)
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
	return func(s *sql.Selector) {
		batch := sql.Select(entlock.FieldID).
			From(sql.Table(entlock.Table)).
			Where(sql.LTE(entlock.FieldExpiresAt, formatTime(now))).
			OrderBy(entlock.FieldExpiresAt).
			Limit(limit)
		s.Where(sql.In(s.C(entlock.FieldID), batch))
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
