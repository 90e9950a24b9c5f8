package entstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"runtime"
	"slices"
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

// errRowChanged reports that the row an Update read was changed by a
// statement outside the resource's exclusion (a release, a cleanup) before
// the Update wrote it; the Update is then decided again.
var errRowChanged = errors.New("the lock changed while it was being updated")

// updateAttempts bounds how often an Update is decided again after
// errRowChanged.
const updateAttempts = 3

// Update implements application.LockRepository. The read and the write
// share one transaction that no other Update of the resource can enter
// (the backend's write lock, or TxSteps.First), so nothing can slip in
// between; a release or a cleanup that changed the row meanwhile makes
// the Update decide again.
//
// A refusal needs no write, and a resource that was just refused is likely
// to be refused again: for those the decision is first taken on a plain
// read, which does not wait for writers. Pollers of a held lock then
// neither queue behind the holder's release nor wait for the database's
// write lock. The refusal is exact: the lock it names was stored and
// active at the read. Anything else is decided again under the write
// lock.
func (s *Store) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	l, _, err := s.UpdateTx(ctx, ref, decide, TxSteps{})
	return l, err
}

// TxSteps are a database's own steps in an Update's transaction.
type TxSteps struct {
	// First runs before the read, and must keep every other Update of
	// the resource out until the transaction ends.
	First func(ctx context.Context, tx *sql.Tx) error
	// Replacing runs before a change of hands removes cur, the lock the
	// decision was taken on. An error of it that matches
	// domain.ErrConflict refuses the change, as the decision's own error.
	Replacing func(ctx context.Context, tx *sql.Tx, cur *domain.Lock, change application.Change) error
	// Inserted runs after a new lock is inserted, and returns a note on
	// it (such as the row's version) that UpdateTx returns.
	Inserted func(ctx context.Context, tx *sql.Tx, l domain.Lock) (string, error)
}

// UpdateTx is Update with the database's own steps in its transaction.
// It returns, with the lock, the note of Inserted from the run that
// stands ("" when that run inserted nothing).
func (s *Store) UpdateTx(ctx context.Context, ref domain.ResourceRef, decide application.Decide, steps TxSteps) (domain.Lock, string, error) {
	if s.contended.Has(ref) {
		cur, err := s.ReadLock(ctx, ref)
		if err != nil {
			return domain.Lock{}, "", s.explain(ctx, err, "read lock on "+ref.String())
		}
		if _, err := decide(cur); errors.Is(err, domain.ErrConflict) {
			// A caller refused here is likely to ask again at once; on a
			// busy processor its loop of cheap reads would keep the holder,
			// whose release it waits for, from running. Yielding once per
			// refusal took 8 pollers of one resource from 1.04 ms to
			// 0.32 ms per hand-over (BenchmarkOneResource/ServicePolling).
			runtime.Gosched()
			return domain.Lock{}, "", err
		}
	}
	var (
		out written
		err error
	)
	for attempt := 1; attempt <= updateAttempts; attempt++ {
		out, err = inTx(ctx, s, steps.First, func(ctx context.Context, tx *sql.Tx) (written, error) {
			cur, err := scanLock(s.On(ctx, tx, s.stmts.sel).QueryRowContext(ctx, string(ref.Type), ref.ID))
			if err != nil {
				return written{}, err
			}
			change, err := decide(cur)
			s.contended.Note(ref, errors.Is(err, domain.ErrConflict))
			if err != nil {
				return written{}, decided{err}
			}
			return s.apply(ctx, tx, ref, cur, change, steps)
		})
		if !errors.Is(err, errRowChanged) {
			break
		}
	}
	// Decide's own error, which the port promises to return unchanged: not
	// joined, wrapped or explained. It comes from the run that stands, as
	// the write's error does.
	if d, ok := errors.AsType[decided](err); ok {
		return domain.Lock{}, "", d.err
	}
	if err != nil {
		return domain.Lock{}, "", s.Failed(ctx, err, "update lock on", ref)
	}
	return out.lock, out.note, nil
}

// written is what one run of an Update's transaction wrote: the lock as
// stored, and the note of TxSteps.Inserted.
type written struct {
	lock domain.Lock
	note string
}

// decided carries a Decide function's error out of the write that asked
// it, apart from the store's own errors.
type decided struct{ err error }

func (d decided) Error() string { return d.err.Error() }

// apply writes change inside tx and returns the lock as stored: its times
// read back through the stored form, so that the caller compares exactly
// what SQL compares.
//
// Each statement's WHERE names the row version the decision was taken on
// (its token and its expiry as read), not only the row: a statement that
// matched a row changed since would carry out a decision nobody took.
// Another Update cannot change the row meanwhile (the backend's write
// lock, or TxSteps.First), but a release or a cleanup can delete it.
func (s *Store) apply(ctx context.Context, tx *sql.Tx, ref domain.ResourceRef, cur *domain.Lock, change application.Change, steps TxSteps) (written, error) {
	switch change.Kind {
	case application.ChangeExtend:
		if cur == nil {
			return written{}, &domain.StoreError{Op: "extend lock", Err: errNoRow}
		}
		expires := FormatTime(change.Lock.ExpiresAt)
		res, err := s.On(ctx, tx, s.stmts.extend).ExecContext(ctx, expires, cur.Token, FormatTime(cur.ExpiresAt))
		if err := oneRow(res, err); err != nil {
			return written{}, err
		}
		l := *cur
		l.ExpiresAt, err = ParseTime(entlock.FieldExpiresAt, expires)
		return written{lock: l}, err
	case application.ChangeInsert:
		// A change of hands inserts a new row, so the lock gets a new id
		// (an AUTOINCREMENT or identity column): its fencing token, never
		// reused. The old row goes only if it is still the version that
		// was decided on; if a release or a cleanup removed it meanwhile,
		// there is nothing to remove.
		if cur != nil {
			if steps.Replacing != nil {
				if err := steps.Replacing(ctx, tx, cur, change); err != nil {
					if errors.Is(err, domain.ErrConflict) {
						return written{}, decided{err}
					}
					return written{}, err
				}
			}
			if _, err := s.On(ctx, tx, s.stmts.delID).ExecContext(ctx, cur.Token, FormatTime(cur.ExpiresAt)); err != nil {
				return written{}, err
			}
		}
		l := change.Lock
		l.Resource = ref
		acquired, expires := FormatTime(l.AcquiredAt), FormatTime(l.ExpiresAt)
		err := s.On(ctx, tx, s.stmts.insert).QueryRowContext(ctx,
			l.Owner, string(ref.Type), ref.ID, acquired, expires).Scan(&l.Token)
		if err != nil {
			return written{}, err
		}
		var note string
		if steps.Inserted != nil {
			if note, err = steps.Inserted(ctx, tx, l); err != nil {
				return written{}, err
			}
		}
		if l.AcquiredAt, err = ParseTime(entlock.FieldAcquiredAt, acquired); err != nil {
			return written{}, err
		}
		l.ExpiresAt, err = ParseTime(entlock.FieldExpiresAt, expires)
		return written{lock: l, note: note}, err
	}
	if cur == nil {
		return written{}, nil
	}
	return written{lock: *cur}, nil
}

// oneRow checks that a statement changed exactly the one row it named.
func oneRow(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n != 1 {
		return errRowChanged
	}
	return nil
}

// Get implements application.LockRepository.
func (s *Store) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	var cur *domain.Lock
	err := s.reading(ctx, func(ctx context.Context) (err error) {
		cur, err = s.ReadLock(ctx, ref)
		return err
	})
	switch {
	case err != nil:
		return domain.Lock{}, s.explain(ctx, err, "get lock on "+ref.String())
	case cur == nil:
		return domain.Lock{}, domain.ErrNotFound
	}
	return *cur, nil
}

// List implements application.LockRepository.
func (s *Store) List(ctx context.Context, f application.ListFilter) ([]domain.Lock, error) {
	q := s.readEnt.Lock.Query()
	if f.Type != "" {
		q = q.Where(entlock.ResourceType(string(f.Type)))
	}
	if f.Owner != "" {
		q = q.Where(entlock.OwnerID(f.Owner))
	}
	if !f.ActiveAt.IsZero() {
		q = q.Where(entlock.ExpiresAtGT(FormatTime(f.ActiveAt)))
	}
	var rows []*ent.Lock
	err := s.reading(ctx, func(ctx context.Context) (err error) {
		rows, err = q.Clone().All(ctx)
		return err
	})
	if err != nil {
		return nil, s.explain(ctx, err, "list locks")
	}
	out := make([]domain.Lock, 0, len(rows))
	for _, row := range rows {
		l, err := toDomain(row)
		if err != nil {
			return nil, s.explain(ctx, err, "list locks")
		}
		out = append(out, l)
	}
	// In byte order, as the port promises, whatever the database's
	// collation (under en-US, "_x" sorts before "a" and "B" after "a1").
	slices.SortFunc(out, func(a, b domain.Lock) int {
		return cmp.Or(cmp.Compare(a.Resource.Type, b.Resource.Type), cmp.Compare(a.Resource.ID, b.Resource.ID))
	})
	return out, nil
}

// DeleteOwned implements application.LockRepository with one statement.
func (s *Store) DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error) {
	n, err := s.ReleaseRows(ctx, ref, owner, 0, "")
	if err != nil {
		// The release is not known to stand: what a run that was rolled
		// back removed is there again.
		return false, s.Failed(ctx, err, "release lock on", ref)
	}
	if n > 0 {
		s.released(ref)
	}
	return n > 0, nil
}

// DeleteToken implements application.LockRepository with one statement,
// whose WHERE is the whole decision: this token, on this resource, active
// at now.
func (s *Store) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	n, err := s.ReleaseRows(ctx, ref, "", token, FormatTime(now))
	if err != nil {
		// As for DeleteOwned: a release rolled back is not known to stand.
		return false, s.Failed(ctx, err, "release lock on", ref)
	}
	if n > 0 {
		s.released(ref)
	}
	return n > 0, nil
}

// ReleaseRows runs the release of DeleteOwned (token 0) or DeleteToken
// (now as stored), and returns the rows it removed, or the database's
// error as it is. It tells Released nothing.
func (s *Store) ReleaseRows(ctx context.Context, ref domain.ResourceRef, owner string, token int64, now string) (int64, error) {
	return WriteOne(ctx, s, OneStatement, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		st, args := s.stmts.delOwned, []any{string(ref.Type), ref.ID, owner}
		if token != 0 {
			st, args = s.stmts.delToken, []any{string(ref.Type), ref.ID, token, now}
		}
		res, err := s.On(ctx, tx, st).ExecContext(ctx, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
}

// DeleteAllOwned implements application.LockRepository.
func (s *Store) DeleteAllOwned(ctx context.Context, owner string) (int, error) {
	b := entsql.Dialect(s.b.Dialect)
	query, args := b.Delete(entlock.Table).Where(entsql.EQ(entlock.FieldOwnerID, owner)).Query()
	n, err := s.deleteRows(ctx, OneStatement, s.b.releasing(query), args)
	if err != nil {
		return n, s.explain(ctx, err, "release locks of "+owner)
	}
	if n > 0 {
		s.released()
	}
	return n, nil
}

// DeleteExpired implements application.LockRepository: one short write
// that removes at most limit expired rows, found through the expires_at
// index.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	query, args := deleteExpired(s.b.Dialect, now, limit)
	n, err := s.deleteRows(ctx, Cleanup, query, args)
	if err != nil {
		return n, s.explain(ctx, err, "clean up expired locks")
	}
	return n, nil
}

// deleteRows runs one DELETE as a write and returns how many rows it
// removed.
func (s *Store) deleteRows(ctx context.Context, kind WriteKind, query string, args []any) (int, error) {
	n, err := WriteOne(ctx, s, kind, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		var x interface {
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		} = s.write
		if tx != nil {
			x = tx
		}
		res, err := x.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	return int(n), err
}

// released reports to the backend that the locks on refs (none: any
// lock) came free.
func (s *Store) released(refs ...domain.ResourceRef) {
	if s.b.Released != nil {
		s.b.Released(refs...)
	}
}

// CountExpired implements application.LockRepository.
func (s *Store) CountExpired(ctx context.Context, now time.Time) (int, error) {
	var n int
	err := s.reading(ctx, func(ctx context.Context) (err error) {
		n, err = s.readEnt.Lock.Query().Where(expiredAt(now)).Count(ctx)
		return err
	})
	if err != nil {
		return 0, s.explain(ctx, err, "count expired locks")
	}
	return n, nil
}

func byResource(ref domain.ResourceRef) predicate.Lock {
	return entlock.And(entlock.ResourceType(string(ref.Type)), entlock.ResourceID(ref.ID))
}

// expiredAt matches the rows that have expired at now: the same rule as
// domain.Lock.ExpiredAt, in SQL.
func expiredAt(now time.Time) predicate.Lock {
	return entlock.ExpiresAtLTE(FormatTime(now))
}

// deleteExpired is the statement that removes at most limit expired rows,
// oldest first, chosen by a subquery on the expires_at index (DELETE ...
// LIMIT is not in every database). The expiry is tested on the deleted
// row itself as well, not only in the subquery: a DELETE that waited for
// a concurrent renew to commit re-checks its own WHERE against the
// renewed row, but, in some databases, not the subquery that chose it.
func deleteExpired(dialectName string, now time.Time, limit int) (string, []any) {
	b := entsql.Dialect(dialectName)
	expired := entsql.LTE(entlock.FieldExpiresAt, FormatTime(now))
	batch := b.Select(entlock.FieldID).
		From(b.Table(entlock.Table)).
		Where(expired).
		OrderBy(entlock.FieldExpiresAt).
		Limit(limit)
	return b.Delete(entlock.Table).Where(entsql.And(
		entsql.LTE(entlock.FieldExpiresAt, FormatTime(now)),
		entsql.In(entlock.FieldID, batch),
	)).Query()
}

func toDomain(row *ent.Lock) (domain.Lock, error) {
	acquired, err := ParseTime(entlock.FieldAcquiredAt, row.AcquiredAt)
	if err != nil {
		return domain.Lock{}, &domain.StoreError{Op: "read lock", Kind: domain.StoreCorrupt, Err: err}
	}
	expires, err := ParseTime(entlock.FieldExpiresAt, row.ExpiresAt)
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
