package entstore

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"time"

	"entgo.io/ent/dialect"
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
// (an immediate transaction on SQLite, an advisory lock on PostgreSQL), so
// nothing can slip in between; a release or a cleanup that changed the row
// meanwhile makes the Update decide again.
//
// A refusal needs no write, and a resource that was just refused is likely
// to be refused again: for those the decision is first taken on a plain
// read, which does not wait for writers (WAL on SQLite, MVCC on
// PostgreSQL). Pollers of a held lock then neither queue behind the
// holder's release nor wait for the database's write lock (SQLite's
// sleeping busy handler). The refusal is exact: the lock it names was
// stored and active at the read. Anything else is decided again under the
// write lock.
func (s *Store) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	return s.update(ctx, ref, decide, nil)
}

// update is Update. When inserted is not nil, it is set to the row
// version (PostgreSQL's xmin) of the lock that the run that stands
// inserted, read in its transaction, so that the acquisition can be
// undone by its token and version (PostgresStore.Update).
func (s *Store) update(ctx context.Context, ref domain.ResourceRef, decide application.Decide, inserted *string) (domain.Lock, error) {
	if s.contended.has(ref) {
		cur, err := s.readLock(ctx, ref)
		if err != nil {
			return domain.Lock{}, s.explain(ctx, err, "read lock on "+ref.String())
		}
		if _, err := decide(cur); errors.Is(err, domain.ErrConflict) {
			// A caller refused here is likely to ask again at once; on a
			// busy processor its loop of cheap reads would keep the holder,
			// whose release it waits for, from running. Yielding once per
			// refusal took 8 pollers of one resource from 1.04 ms to
			// 0.32 ms per hand-over (BenchmarkOneResource/ServicePolling).
			runtime.Gosched()
			return domain.Lock{}, err
		}
	}
	var (
		out domain.Lock
		err error
	)
	for attempt := 1; attempt <= updateAttempts; attempt++ {
		out, err = inTx(ctx, s, ref, func(ctx context.Context, tx *sql.Tx) (domain.Lock, error) {
			cur, err := scanLock(s.on(ctx, tx, s.stmts.sel).QueryRowContext(ctx, string(ref.Type), ref.ID))
			if err != nil {
				return domain.Lock{}, err
			}
			change, err := decide(cur)
			s.contended.note(ref, errors.Is(err, domain.ErrConflict))
			if err != nil {
				return domain.Lock{}, decided{err}
			}
			return s.apply(ctx, tx, ref, cur, change, inserted)
		})
		if !errors.Is(err, errRowChanged) {
			break
		}
	}
	// Decide's own error, which the port promises to return unchanged: not
	// joined, wrapped or explained. It comes from the run that stands, as
	// the write's error does.
	if d, ok := errors.AsType[decided](err); ok {
		return domain.Lock{}, d.err
	}
	if err != nil {
		return domain.Lock{}, s.failed(ctx, err, "update lock on", ref)
	}
	return out, nil
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
// Another Update cannot change the row meanwhile (LockResource, or SQLite's
// single writer), but a release or a cleanup can delete it.
func (s *Store) apply(ctx context.Context, tx *sql.Tx, ref domain.ResourceRef, cur *domain.Lock, change application.Change, inserted *string) (domain.Lock, error) {
	switch change.Kind {
	case application.ChangeExtend:
		if cur == nil {
			return domain.Lock{}, &domain.StoreError{Op: "extend lock", Err: errNoRow}
		}
		expires := formatTime(change.Lock.ExpiresAt)
		res, err := s.on(ctx, tx, s.stmts.extend).ExecContext(ctx, expires, cur.Token, formatTime(cur.ExpiresAt))
		if err := oneRow(res, err); err != nil {
			return domain.Lock{}, err
		}
		l := *cur
		l.ExpiresAt, err = parseTime(entlock.FieldExpiresAt, expires)
		return l, err
	case application.ChangeInsert:
		// A change of hands inserts a new row, so the lock gets a new id
		// (SQLite's AUTOINCREMENT, PostgreSQL's identity sequence): its
		// fencing token, never reused. The old row goes only if it is
		// still the version that was decided on; if a release or a
		// cleanup removed it meanwhile, there is nothing to remove.
		if cur != nil {
			if err := s.changeOfHandsOnServer(ctx, tx, cur, change); err != nil {
				return domain.Lock{}, err
			}
			if _, err := s.on(ctx, tx, s.stmts.delID).ExecContext(ctx, cur.Token, formatTime(cur.ExpiresAt)); err != nil {
				return domain.Lock{}, err
			}
		}
		l := change.Lock
		l.Resource = ref
		acquired, expires := formatTime(l.AcquiredAt), formatTime(l.ExpiresAt)
		err := s.on(ctx, tx, s.stmts.insert).QueryRowContext(ctx,
			l.Owner, string(ref.Type), ref.ID, acquired, expires).Scan(&l.Token)
		if err != nil {
			return domain.Lock{}, err
		}
		if inserted != nil && tx != nil {
			if err := tx.QueryRowContext(ctx, rowVersionSQL, l.Token).Scan(inserted); err != nil {
				return domain.Lock{}, err
			}
		}
		if l.AcquiredAt, err = parseTime(entlock.FieldAcquiredAt, acquired); err != nil {
			return domain.Lock{}, err
		}
		l.ExpiresAt, err = parseTime(entlock.FieldExpiresAt, expires)
		return l, err
	}
	if cur == nil {
		return domain.Lock{}, nil
	}
	return *cur, nil
}

// changeOfHandsOnServer refuses, on PostgreSQL, a change of hands that
// took cur for expired at the decision's now (the new lock's acquisition
// time: the host's estimate of the server's time, which can run ahead of
// it) while it is still active on the server's own clock, read in tx: the
// statements that take over and purge test that clock too (acquireSQL),
// and Update must not take what they would not. A replacement decided at
// a now when cur was active, a dead holder's, is the caller's deliberate
// choice and goes ahead. The refusal is the conflict that the server's
// clock decides, returned as the decision's own error.
func (s *Store) changeOfHandsOnServer(ctx context.Context, tx *sql.Tx, cur *domain.Lock, change application.Change) error {
	if s.b.Dialect != dialect.Postgres || s.b.LocalTime || !cur.ExpiredAt(change.Lock.AcquiredAt) {
		return nil
	}
	server, err := serverNow(ctx, tx)
	if err != nil {
		return err
	}
	if cur.ExpiredAt(server) {
		return nil
	}
	return decided{&domain.LockConflictError{Holder: *cur, Now: server, SameOwner: cur.Owner == change.Lock.Owner}}
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
		cur, err = s.readLock(ctx, ref)
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
		q = q.Where(entlock.ExpiresAtGT(formatTime(f.ActiveAt)))
	}
	q = q.Order(byBytes(entlock.FieldResourceType), byBytes(entlock.FieldResourceID))
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
	return out, nil
}

// DeleteOwned implements application.LockRepository with one statement.
func (s *Store) DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error) {
	n, err := s.deleteOwned(ctx, ref, owner)
	if err != nil {
		// The release is not known to stand: what a run that was rolled
		// back removed is there again.
		return false, s.failed(ctx, err, "release lock on", ref)
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
	n, err := s.deleteToken(ctx, ref, token, formatTime(now))
	if err != nil {
		// As for DeleteOwned: a release rolled back is not known to stand.
		return false, s.failed(ctx, err, "release lock on", ref)
	}
	if n > 0 {
		s.released(ref)
	}
	return n > 0, nil
}

// deleteOwned runs DeleteOwned's statement and returns the rows it
// removed, or the database's error as it is.
func (s *Store) deleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (int64, error) {
	return writeOne(ctx, s, OneStatement, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		res, err := s.on(ctx, tx, s.stmts.delOwned).ExecContext(ctx, string(ref.Type), ref.ID, owner)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
}

// deleteToken runs DeleteToken's statement, with now as stored.
func (s *Store) deleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now string) (int64, error) {
	return writeOne(ctx, s, OneStatement, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		res, err := s.on(ctx, tx, s.stmts.delToken).ExecContext(ctx, string(ref.Type), ref.ID, token, now)
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
	query, args := deleteExpired(s.b.Dialect, now, limit, !s.b.LocalTime)
	n, err := s.deleteRows(ctx, Cleanup, query, args)
	if err != nil {
		return n, s.explain(ctx, err, "clean up expired locks")
	}
	return n, nil
}

// deleteRows runs one DELETE as a write and returns how many rows it
// removed.
func (s *Store) deleteRows(ctx context.Context, kind WriteKind, query string, args []any) (int, error) {
	n, err := writeOne(ctx, s, kind, func(ctx context.Context, tx *sql.Tx) (int64, error) {
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
	return entlock.ExpiresAtLTE(formatTime(now))
}

// deleteExpired is the statement that removes at most limit expired rows,
// oldest first, chosen by a subquery on the expires_at index: SQLite has
// no DELETE ... LIMIT by default.
//
// The expiry is tested on the deleted row itself as well, not only in the
// subquery. On PostgreSQL, a DELETE that waited for a concurrent renew to
// commit re-checks its own WHERE against the renewed row, but not the
// subquery that chose it: with "id IN (...)" alone, a lock renewed a moment
// before its expiry was deleted after its holder had been told it held it.
//
// On PostgreSQL a row must have expired on the server's clock too (unless
// Backend.LocalTime): now is
// the host's estimate of the server's time, which a link slower one way
// than the other can put seconds ahead, and a cleanup must never purge a
// lock that is still active on the server (another host would then take
// it before its expiry).
//
// On PostgreSQL the subquery also locks the rows it chooses, FOR UPDATE
// SKIP LOCKED: a row that another transaction holds is left for a later
// cleanup rather than waited for. A fenced transaction holds its lock's
// row (FOR KEY SHARE) until it ends, and may run on past the lock's
// expiry: the lock does not change hands meanwhile, and a cleanup that
// waited for it held up the Open of every new container (its startup
// cleanup) for as long as the transaction ran. The row a cleanup then
// deletes is one it has locked, tested again by the DELETE's own WHERE
// (above), so skipping decides nothing on a weaker test.
func deleteExpired(dialectName string, now time.Time, limit int, onServer bool) (string, []any) {
	b := entsql.Dialect(dialectName)
	expired := func() *entsql.Predicate {
		p := entsql.LTE(entlock.FieldExpiresAt, formatTime(now))
		if dialectName == dialect.Postgres && onServer {
			p = entsql.And(p, entsql.P(func(b *entsql.Builder) {
				b.WriteString(serverExpired)
			}))
		}
		return p
	}
	batch := b.Select(entlock.FieldID).
		From(b.Table(entlock.Table)).
		Where(expired()).
		OrderBy(entlock.FieldExpiresAt).
		Limit(limit)
	if dialectName == dialect.Postgres {
		batch.ForUpdate(entsql.WithLockAction(entsql.SkipLocked))
	}
	return b.Delete(entlock.Table).Where(entsql.And(
		expired(),
		entsql.In(entlock.FieldID, batch),
	)).Query()
}

// byBytes orders by column in byte order on every database, as the port
// promises, and as SQLite's default collation and Go's string comparison
// do. PostgreSQL would otherwise sort by the database's collation, which
// under en-US puts "_x" before "a" and "B" after "a1".
func byBytes(column string) func(*entsql.Selector) {
	return func(s *entsql.Selector) {
		if s.Dialect() == dialect.Postgres {
			s.OrderExpr(entsql.Expr(s.C(column) + ` COLLATE "C"`))
			return
		}
		s.OrderBy(s.C(column))
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
