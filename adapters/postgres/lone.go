package postgres

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// lone runs each write of s as its own statement.
type lone struct{ s *LockRepository }

func (l lone) free(ctx context.Context, r writeReq) (made, error) {
	return runOne(ctx, l.s.left, r, l.s.acquireFreeOne, l.s.undoMade)
}

func (l lone) acquire(ctx context.Context, r writeReq) (made, error) {
	return runOne(ctx, l.s.left, r, l.s.acquireOne, l.s.undoMade)
}

func (l lone) acquireAlone(ctx context.Context, r writeReq) (made, error) { return l.acquire(ctx, r) }

func (l lone) renew(ctx context.Context, r writeReq) (made, error) { return l.s.renewOne(ctx, r) }

func (l lone) release(ctx context.Context, r releaseReq) (bool, error) { return l.s.releaseOne(ctx, r) }

func (lone) stop() {}

// writeReq is an acquire (take: a Take) or a renewal (token 0: by owner):
// the advisory lock key, now and the new expiry as stored.
type writeReq struct {
	key          int64
	ref          domain.ResourceRef
	owner        string
	now, expires string
	take         bool
	token        int64
	note         string // an acquire's, for a new lock
}

// args are the parameters $1-$6 of acquireSQL, acquireFreeSQL and renewSQL.
func (r writeReq) args() []any {
	return []any{r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires}
}

// acquireArgs are the parameters $1-$7 of acquireSQL and acquireFreeSQL.
func (r writeReq) acquireArgs() []any { return append(r.args(), r.note) }

// releaseReq is a release: by owner (token 0) or by token, active at now.
type releaseReq struct {
	ref   domain.ResourceRef
	owner string
	token int64
	now   string
}

// made is acquireSQL's row for one caller (acquireFreeSQL and renewSQL
// return part of it). No id: no row, or nothing changed.
type made struct {
	reentered bool
	id        sql.NullInt64
	times     [2]sql.NullString // acquired, expires
	prevID    sql.NullInt64     // the lock replaced, if any:
	prev      [3]sql.NullString // its owner, acquired, expires
	version   sql.NullString    // the row inserted (its xmin), for undo
	note      sql.NullString    // the lock's note
	prevNote  sql.NullString    // the note of the lock replaced
	server    sql.NullTime      // the server's clock, read in the statement
}

// acquireCols, freeCols and renewCols take the columns of acquireSQL, acquireFreeSQL and renewSQL.
func acquireCols(m *made) []any {
	return []any{&m.reentered, &m.id, &m.times[0], &m.times[1], &m.prevID, &m.prev[0], &m.prev[1], &m.prev[2], &m.version, &m.note, &m.prevNote, &m.server}
}
func freeCols(m *made) []any  { return []any{&m.id, &m.version, &m.server} }
func renewCols(m *made) []any { return []any{&m.id, &m.times[0], &m.times[1], &m.note, &m.server} }

// outcome is the acquisition m describes, of owner on ref.
func (m made) outcome(ref domain.ResourceRef, owner string) (application.Outcome, error) {
	a := application.Outcome{Kind: application.ChangeInsert, Lock: domain.Lock{Token: m.id.Int64, Owner: owner, Resource: ref, Note: m.note.String}}
	if m.reentered {
		a.Kind = application.ChangeExtend
	}
	if err := entstore.ParseTimes(&a.Lock, m.times[0].String, m.times[1].String); err != nil {
		return a, err
	}
	if m.prevID.Valid {
		p := domain.Lock{Token: m.prevID.Int64, Owner: m.prev[0].String, Resource: ref, Note: m.prevNote.String}
		if err := entstore.ParseTimes(&p, m.prev[1].String, m.prev[2].String); err != nil {
			return a, err
		}
		a.Previous = &p
	}
	return a, nil
}

// writeOne runs query alone and reads its row, if any, into cols; the
// server's time in it re-anchors the store's ServerClocks.
func (s *LockRepository) writeOne(ctx context.Context, query string, args []any, cols func(*made) []any) (made, error) {
	return entstore.WriteOne(ctx, s.Store, entstore.OneStatement, func(ctx context.Context, _ *sql.Tx) (made, error) {
		var m made
		sent := s.clocks.send()
		err := s.db.QueryRowContext(ctx, query, args...).Scan(cols(&m)...)
		if errors.Is(err, sql.ErrNoRows) {
			return made{}, nil
		}
		if err == nil && m.server.Valid {
			sent.answered(m.server.Time)
		}
		return m, err
	})
}

func (s *LockRepository) acquireFreeOne(ctx context.Context, r writeReq) (made, error) {
	return s.writeOne(ctx, acquireFreeSQL, r.acquireArgs(), freeCols)
}

func (s *LockRepository) acquireOne(ctx context.Context, r writeReq) (made, error) {
	if r.take {
		return s.writeOne(ctx, s.pick(takeSQL), r.acquireArgs(), acquireCols)
	}
	return s.writeOne(ctx, s.pick(acquireSQL), r.acquireArgs(), acquireCols)
}

func (s *LockRepository) renewOne(ctx context.Context, r writeReq) (made, error) {
	if r.token != 0 {
		return s.writeOne(ctx, renewTokenSQL, append(r.args(), r.token), renewCols)
	}
	return s.writeOne(ctx, renewSQL, r.args(), renewCols)
}

func (s *LockRepository) releaseOne(ctx context.Context, r releaseReq) (bool, error) {
	n, err := s.ReleaseRows(ctx, r.ref, r.owner, r.token, r.now)
	return n > 0, err
}

// undoTimeout bounds an undo: past it, the lock expires on its own.
const undoTimeout = 10 * time.Second

// undoVersionSQL deletes the version of lock $1 that xmin $2 wrote.
var undoVersionSQL = pgStatement(`DELETE FROM {locks} WHERE {id} = $1::bigint AND xmin = $2::xid`)

// undo releases the lock token on ref, acquired for a caller that left,
// if its row is still the version written for it (a re-entry since keeps
// the token in a new version). It reports whether the database answered.
func (s *LockRepository) undo(ref domain.ResourceRef, token int64, version string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	n, err := entstore.WriteOne(ctx, s.Store, entstore.OneStatement, func(ctx context.Context, _ *sql.Tx) (int64, error) {
		res, err := s.db.ExecContext(ctx, s.undoSQL, token, version)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	if err == nil && n > 0 {
		s.occupied.Note(ref, false)
	}
	return err == nil
}

// undoMade undoes m, an insert whose caller left; it reports whether the database answered.
func (s *LockRepository) undoMade(r writeReq, m made) bool {
	if m.id.Valid && !m.reentered && m.version.String != "" {
		return s.undo(r.ref, m.id.Int64, m.version.String)
	}
	return true
}
