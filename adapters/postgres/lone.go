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

func (l lone) free(ctx context.Context, r writeReq) (inserted, error) {
	return runOne(ctx, l.s.left, r, l.s.acquireFreeOne, l.s.undoFree)
}

func (l lone) acquire(ctx context.Context, r writeReq) (made, error) {
	return runOne(ctx, l.s.left, r, l.s.acquireOne, l.s.undoMade)
}

func (l lone) acquireAlone(ctx context.Context, r writeReq) (made, error) { return l.acquire(ctx, r) }

func (l lone) renew(ctx context.Context, r writeReq) (extension, error) { return l.s.renewOne(ctx, r) }

func (l lone) release(ctx context.Context, r releaseReq) (bool, error) {
	return l.s.releaseOne(ctx, r)
}

func (lone) stop() {}

// writeReq is an acquire or a renewal: its resource's advisory lock key,
// its resource, its owner, now and the new expiry as stored; for an
// acquire whether it is a Take (take), for a renewal the token (0: by
// owner).
type writeReq struct {
	key          int64
	ref          domain.ResourceRef
	owner        string
	now, expires string
	take         bool
	token        int64
}

// releaseReq is a release: by owner (token 0) or
// by token, active at now.
type releaseReq struct {
	ref   domain.ResourceRef
	owner string
	token int64
	now   string
}

// inserted is the outcome of acquireFreeSQL for one caller.
type inserted struct {
	token int64
	ok    bool // false: the resource has a row
	// version is the row version written (its xmin), for undo.
	version string
}

// made is the outcome of acquireSQL or takeSQL for one caller.
type made struct {
	a       application.Outcome
	decided bool   // false: no row came back
	version string // the row version inserted (its xmin), for undo
}

// extension is the outcome of renewSQL or renewTokenSQL for one caller.
type extension struct {
	token    int64
	times    [2]string // acquired, expires
	extended bool      // false: no row came back
}

// acquireFreeOne runs acquireFreeSQL for one caller.
func (s *LockRepository) acquireFreeOne(ctx context.Context, r writeReq) (inserted, error) {
	return entstore.WriteOne(ctx, s.Store, entstore.OneStatement, func(ctx context.Context, _ *sql.Tx) (inserted, error) {
		var (
			token   int64
			version string
		)
		err := s.db.QueryRowContext(ctx, acquireFreeSQL, r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires).Scan(&token, &version)
		if errors.Is(err, sql.ErrNoRows) {
			return inserted{}, nil
		}
		return inserted{token: token, ok: err == nil, version: version}, err
	})
}

// acquireOne runs acquireSQL, or takeSQL for a Take, for one caller.
func (s *LockRepository) acquireOne(ctx context.Context, r writeReq) (made, error) {
	statement := s.pick(acquireSQL)
	if r.take {
		statement = s.pick(takeSQL)
	}
	return entstore.WriteOne(ctx, s.Store, entstore.OneStatement, func(ctx context.Context, _ *sql.Tx) (made, error) {
		rows, err := s.db.QueryContext(ctx, statement, r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires)
		if err != nil {
			return made{}, err
		}
		defer rows.Close()
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return made{}, err
			}
			return made{}, rows.Close()
		}
		a, version, err := scanAcquisition(rows, r.ref, r.owner)
		if err != nil {
			return made{}, err
		}
		return made{a: a, decided: true, version: version}, rows.Close()
	})
}

// renewOne runs renewSQL, or renewTokenSQL for a token, for one caller.
func (s *LockRepository) renewOne(ctx context.Context, r writeReq) (extension, error) {
	query, args := renewSQL, []any{r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires}
	if r.token != 0 {
		query, args = renewTokenSQL, append(args, r.token)
	}
	return entstore.WriteOne(ctx, s.Store, entstore.OneStatement, func(ctx context.Context, _ *sql.Tx) (extension, error) {
		var e extension
		err := s.db.QueryRowContext(ctx, query, args...).Scan(&e.token, &e.times[0], &e.times[1])
		if errors.Is(err, sql.ErrNoRows) {
			return extension{}, nil
		}
		e.extended = err == nil
		return e, err
	})
}

// releaseOne runs the Store's release by owner or by token for one
// caller, and returns whether it removed the lock.
func (s *LockRepository) releaseOne(ctx context.Context, r releaseReq) (bool, error) {
	n, err := s.ReleaseRows(ctx, r.ref, r.owner, r.token, r.now)
	return n > 0, err
}

// undoTimeout bounds the release of a lock acquired for a caller that
// left: past it, the lock expires on its own.
const undoTimeout = 10 * time.Second

// undo releases the lock token on ref, acquired for a caller that had
// left, if its row is still the version written for it (its xmin, the
// writing transaction): the same owner's next acquire re-enters it, which
// keeps the token, and that caller holds it; its update writes a new
// version, even when its times are the first's to the microsecond (a
// clock that stands still, two calls in one microsecond).
//
// It reports whether the database answered (whether or not the version
// was still there to release).
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

// undoVersionSQL deletes the row version that an acquire wrote: $1 its
// id, $2 its xmin.
var undoVersionSQL = pgStatement(`DELETE FROM {locks} WHERE {id} = $1::bigint AND xmin = $2::xid`)

// undoFree undoes in, an acquire of a free resource whose caller left;
// it reports whether the database answered.
func (s *LockRepository) undoFree(r writeReq, in inserted) bool {
	if in.ok {
		return s.undo(r.ref, in.token, in.version)
	}
	return true
}

// undoMade undoes m, an acquire whose caller left, unless it re-entered
// the caller's own lock; it reports whether the database answered.
func (s *LockRepository) undoMade(r writeReq, m made) bool {
	if m.decided && m.a.Kind == application.ChangeInsert && m.version != "" {
		return s.undo(r.ref, m.a.Lock.Token, m.version)
	}
	return true
}

// scanAcquisition reads acquireSQL's row.
func scanAcquisition(rows *sql.Rows, ref domain.ResourceRef, owner string) (application.Outcome, string, error) {
	var (
		reentered bool
		token     int64
		times     [2]string         // acquired, expires
		prevID    sql.NullInt64     // the lock replaced, if any:
		prev      [3]sql.NullString // its owner, acquired, expires
		version   sql.NullString    // of the row inserted
	)
	if err := rows.Scan(&reentered, &token, &times[0], &times[1], &prevID, &prev[0], &prev[1], &prev[2], &version); err != nil {
		return application.Outcome{}, "", err
	}
	a, err := acquisitionOf(ref, owner, reentered, token, times[0], times[1], prevID, prev)
	return a, version.String, err
}

// acquisitionOf builds the acquisition that acquireSQL's row describes.
func acquisitionOf(ref domain.ResourceRef, owner string, reentered bool, token int64, acquired, expires string,
	prevID sql.NullInt64, prev [3]sql.NullString) (application.Outcome, error) {
	a := application.Outcome{Kind: application.ChangeInsert, Lock: domain.Lock{Token: token, Owner: owner, Resource: ref}}
	if reentered {
		a.Kind = application.ChangeExtend
	}
	if err := entstore.ParseTimes(&a.Lock, acquired, expires); err != nil {
		return a, err
	}
	if prevID.Valid {
		p := domain.Lock{Token: prevID.Int64, Owner: prev[0].String, Resource: ref}
		if err := entstore.ParseTimes(&p, prev[1].String, prev[2].String); err != nil {
			return a, err
		}
		a.Previous = &p
	}
	return a, nil
}
