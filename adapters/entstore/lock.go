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
)

var (
	errNoRow = errors.New("no lock to extend") // a Decide that extended no lock: a caller's bug
	// errRowChanged: a release or cleanup changed the row an Update read; it decides again.
	errRowChanged = errors.New("the lock changed while it was being updated")
)

const updateAttempts = 3

// Update implements application.LockRepository: read and write share a
// transaction no other Update of the resource enters (write lock or First).
func (s *Store) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	l, _, err := s.UpdateTx(ctx, ref, decide, TxSteps{})
	return l, err
}

// TxSteps are a database's own steps in an Update's transaction.
type TxSteps struct {
	// First runs before the read and keeps the resource's other Updates out until the end.
	First func(ctx context.Context, tx *sql.Tx) error
	// Replacing runs before a change of hands removes cur; ErrConflict refuses it as Decide would.
	Replacing func(ctx context.Context, tx *sql.Tx, cur *domain.Lock, change application.Change) error
	// Inserted runs after an insert and returns a note on the new lock (its row version).
	Inserted func(ctx context.Context, tx *sql.Tx, l domain.Lock) (string, error)
}

// UpdateTx is Update with the database's steps, and returns the note of
// Inserted from the run that stands ("" for none).
func (s *Store) UpdateTx(ctx context.Context, ref domain.ResourceRef, decide application.Decide, steps TxSteps) (domain.Lock, string, error) {
	// A resource just refused is likely refused again: decide on a plain read first.
	if s.contended.Has(ref) {
		cur, err := s.ReadLock(ctx, ref)
		if err != nil {
			return domain.Lock{}, "", s.explain(ctx, err, "read lock on "+ref.String())
		}
		if _, err := decide(cur); errors.Is(err, domain.ErrConflict) {
			// Pollers would keep the holder from running (BenchmarkOneResource).
			runtime.Gosched()
			return domain.Lock{}, "", err
		}
	}
	var out written
	var err error
	for attempt := 1; attempt <= updateAttempts; attempt++ {
		out, err = WriteOne(ctx, s, Statements, func(ctx context.Context, tx *sql.Tx) (written, error) {
			if steps.First != nil {
				if err := steps.First(ctx, tx); err != nil {
					return written{}, err
				}
			}
			cur, err := scanLock(s.On(ctx, tx, s.stmts.sel).QueryRowContext(ctx, string(ref.Type), ref.ID), true)
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
	if d, ok := errors.AsType[decided](err); ok {
		return domain.Lock{}, "", d.err
	}
	if err != nil {
		return domain.Lock{}, "", s.Failed(ctx, err, "update lock on", ref)
	}
	if out.replaced {
		s.b.replaced(ctx, ref)
	}
	return out.lock, out.note, nil
}

type written struct {
	lock     domain.Lock
	note     string
	replaced bool // another lock was deleted for this one
}

// decided carries a Decide function's error apart from the store's own.
type decided struct{ err error }

func (d decided) Error() string { return d.err.Error() }

// apply writes change in tx and returns the lock with its times as stored.
// Each WHERE names the row version decided on, which a release may have deleted.
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
		// A change of hands inserts a new row: its id is the new fencing token.
		if cur != nil {
			if steps.Replacing != nil {
				if err := steps.Replacing(ctx, tx, cur, change); errors.Is(err, domain.ErrConflict) {
					return written{}, decided{err}
				} else if err != nil {
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
			l.Owner, string(ref.Type), ref.ID, acquired, expires, NoteValue(l.Note)).Scan(&l.Token)
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
		return written{lock: l, note: note, replaced: cur != nil}, err
	}
	if cur == nil {
		return written{}, nil
	}
	return written{lock: *cur}, nil
}

func oneRow(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err == nil && n != 1 {
		err = errRowChanged
	}
	return err
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
	if s.noteless {
		q.Select(lockColumns(false)...)
	}
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
	out := make([]domain.Lock, len(rows))
	for i, row := range rows {
		out[i] = domain.Lock{Token: row.ID, Owner: row.OwnerID, Note: row.Note,
			Resource: domain.ResourceRef{Type: domain.ResourceType(row.ResourceType), ID: row.ResourceID}}
		if err := ParseTimes(&out[i], row.AcquiredAt, row.ExpiresAt); err != nil {
			return nil, s.explain(ctx, err, "list locks")
		}
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
	return s.release(ctx, ref, owner, 0, "")
}

// DeleteToken implements application.LockRepository with one statement.
func (s *Store) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	return s.release(ctx, ref, "", token, FormatTime(now))
}

func (s *Store) release(ctx context.Context, ref domain.ResourceRef, owner string, token int64, now string) (bool, error) {
	n, err := s.ReleaseRows(ctx, ref, owner, token, now)
	if err != nil {
		// Not known to stand: what a rolled-back run removed is back.
		return false, s.Failed(ctx, err, "release lock on", ref)
	}
	if n > 0 && s.b.Released != nil {
		s.b.Released(ref)
	}
	return n > 0, nil
}

// ReleaseRows runs DeleteOwned's (token 0) or DeleteToken's release and
// returns the rows removed; Released is not told.
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
	if n > 0 && s.b.Released != nil {
		s.b.Released()
	}
	return n, nil
}

// DeleteExpired implements application.LockRepository: one write of at most
// limit rows. Its WHERE tests the expiry again: a DELETE that waited for a
// renewal re-checks only that.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	b := entsql.Dialect(s.b.Dialect)
	batch := b.Select(entlock.FieldID).From(b.Table(entlock.Table)).
		Where(entsql.LTE(entlock.FieldExpiresAt, FormatTime(now))).
		OrderBy(entlock.FieldExpiresAt).Limit(limit)
	query, args := b.Delete(entlock.Table).Where(entsql.And(
		entsql.LTE(entlock.FieldExpiresAt, FormatTime(now)),
		entsql.In(entlock.FieldID, batch),
	)).Query()
	n, err := s.deleteRows(ctx, Cleanup, query, args)
	if err != nil {
		return n, s.explain(ctx, err, "clean up expired locks")
	}
	return n, nil
}

func (s *Store) deleteRows(ctx context.Context, kind WriteKind, query string, args []any) (int, error) {
	n, err := WriteOne(ctx, s, kind, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		exec := s.write.ExecContext
		if tx != nil {
			exec = tx.ExecContext
		}
		res, err := exec(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	return int(n), err
}

// CountExpired implements application.LockRepository.
func (s *Store) CountExpired(ctx context.Context, now time.Time) (int, error) {
	var n int
	err := s.reading(ctx, func(ctx context.Context) (err error) {
		n, err = s.readEnt.Lock.Query().Where(entlock.ExpiresAtLTE(FormatTime(now))).Count(ctx)
		return err
	})
	if err != nil {
		return 0, s.explain(ctx, err, "count expired locks")
	}
	return n, nil
}

// statementText is the hot path's SQL, prepared once, as Ent's query layer
// cost 45-90% more per acquire+release; Ent's builder writes it, so that a
// renamed column breaks the build.
type statementText struct {
	sel, insert, extend, delID, delOwned, delToken string
}

func buildStatements(dialectName string) (t statementText) {
	b := entsql.Dialect(dialectName)
	t.sel = selectLock(dialectName, lockColumns(true))
	t.insert, _ = b.Insert(entlock.Table).
		Columns(entlock.FieldOwnerID, entlock.FieldResourceType, entlock.FieldResourceID, entlock.FieldAcquiredAt, entlock.FieldExpiresAt, entlock.FieldNote).
		Values("", "", "", "", "", "").Returning(entlock.FieldID).Query()
	// extend and delID name the row version read: id and expiry.
	thisVersion := entsql.And(entsql.EQ(entlock.FieldID, 0), entsql.EQ(entlock.FieldExpiresAt, ""))
	t.extend, _ = b.Update(entlock.Table).Set(entlock.FieldExpiresAt, "").Where(thisVersion).Query()
	t.delID, _ = b.Delete(entlock.Table).Where(thisVersion).Query()
	t.delOwned, _ = b.Delete(entlock.Table).
		Where(entsql.And(
			entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""),
			entsql.EQ(entlock.FieldOwnerID, ""))).
		Query()
	// delToken, a handle's release, removes nothing once its lock is lost.
	t.delToken, _ = b.Delete(entlock.Table).
		Where(entsql.And(
			entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""),
			entsql.EQ(entlock.FieldID, 0), entsql.GT(entlock.FieldExpiresAt, ""))).
		Query()
	return
}

// lockColumns are the columns a lock is read from: all, or (note false) the
// first migration's, which have no note.
func lockColumns(note bool) []string {
	if note {
		return entlock.Columns
	}
	return slices.DeleteFunc(slices.Clone(entlock.Columns), func(c string) bool { return c == entlock.FieldNote })
}

// selectLock reads cols of the lock on a resource, scanLock's row.
func selectLock(dialectName string, cols []string) string {
	b := entsql.Dialect(dialectName)
	byResource := entsql.And(entsql.EQ(entlock.FieldResourceType, ""), entsql.EQ(entlock.FieldResourceID, ""))
	query, _ := b.Select(cols...).From(b.Table(entlock.Table)).Where(byResource).Query()
	return query
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

// ReadLock reads the lock on ref, or nil, outside any transaction; errors are the database's.
func (s *Store) ReadLock(ctx context.Context, ref domain.ResourceRef) (*domain.Lock, error) {
	if s.stmts.read == nil { // a read-only store prepares nothing
		return scanLock(s.read.QueryRowContext(ctx, s.text.sel, string(ref.Type), ref.ID), !s.noteless)
	}
	return scanLock(s.stmts.read.QueryRowContext(ctx, string(ref.Type), ref.ID), true)
}

// NoteValue is a lock's note as stored: NULL for none, as in the rows that
// were written before the column was added.
func NoteValue(note string) sql.NullString { return sql.NullString{String: note, Valid: note != ""} }

// scanLock reads a row of lockColumns(note), or nil for none.
func scanLock(row interface{ Scan(dest ...any) error }, note bool) (*domain.Lock, error) {
	var l domain.Lock
	var acquired, expires string
	var stored sql.NullString
	dest := []any{&l.Token, &l.Owner, (*string)(&l.Resource.Type), &l.Resource.ID, &acquired, &expires, &stored}
	if !note {
		dest = dest[:len(dest)-1]
	}
	err := row.Scan(dest...)
	l.Note = stored.String
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err == nil {
		err = ParseTimes(&l, acquired, expires)
	}
	if err != nil {
		return nil, err
	}
	return &l, nil
}
