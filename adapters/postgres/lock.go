package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// LockRepository is the lock store on PostgreSQL: the shared store, with
// one-statement acquires, renewals and releases (application.OneStatement).
type LockRepository struct {
	*entstore.Store
	db        *sql.DB
	localTime bool // Options.LocalTime
	// occupied hints where a row is likely (resources this process holds),
	// so that a re-entry skips acquireFreeSQL. It never decides anything.
	occupied entstore.Contention
	w        writes                      // lone, or batches (group commit)
	left     *leftGroup                  // writes going on past their callers, for Close
	undoSQL  string                      // undoVersionSQL with a release's wake-up
	notice   func(typ, id string) string // a batch release's wake-up (watchedOrNotify); nil: none
	// replaced tells the watchers of a lock that a committed takeover
	// replaced (Backend.Replaced); nil: nobody.
	replaced func(ctx context.Context, ref domain.ResourceRef)
	// clocks are the ServerClocks on this store, which the server's time
	// read by its acquires and renewals re-anchors.
	clocks *serverClocks
}

var _ application.OneStatement = (*LockRepository)(nil)

// Apply implements application.OneStatement.
func (s *LockRepository) Apply(ctx context.Context, op application.Op) (application.Outcome, error) {
	switch op.Kind {
	case application.OpAcquire:
		return s.acquireBy(ctx, op.Ref, op.Owner, op.Note, op.At, false, application.DecideAcquire)
	case application.OpTake:
		return s.acquireBy(ctx, op.Ref, op.Owner, op.Note, op.At, true, application.DecideTake)
	case application.OpRenew:
		return s.RenewAt(ctx, op.Ref, op.Owner, op.At)
	case application.OpRenewToken:
		return s.RenewTokenAt(ctx, op.Ref, op.Owner, op.Held.Token, op.At)
	}
	return application.Outcome{}, nil
}

// DecidesAll says that Apply leaves nothing to Update but an extension
// that its lock's expiry overtook and a renewal's refusals.
func (s *LockRepository) DecidesAll() {}

// newLockRepository returns the store s on db with lone writes; release:
// Backend.ReleaseStatement (nil: none).
func newLockRepository(s *entstore.Store, db *sql.DB, localTime bool, release func(string) string, notice func(typ, id string) string) *LockRepository {
	r := &LockRepository{Store: s, db: db, localTime: localTime, left: &leftGroup{}, undoSQL: undoVersionSQL, notice: notice, clocks: &serverClocks{}}
	if release != nil {
		r.undoSQL = release(undoVersionSQL)
	}
	r.w = lone{r}
	return r
}

// writes are the one-statement writes of a LockRepository.
type writes interface {
	free(ctx context.Context, r writeReq) (made, error)
	acquire(ctx context.Context, r writeReq) (made, error)
	// acquireAlone runs r's statement alone, whatever else is in flight.
	acquireAlone(ctx context.Context, r writeReq) (made, error)
	renew(ctx context.Context, r writeReq) (made, error)
	release(ctx context.Context, r releaseReq) (bool, error)
	// stop ends what is still on its way, at Close.
	stop()
}

func (s *LockRepository) explain(ctx context.Context, err error, op string) error {
	return entstore.Explain(ctx, err, op, FormatError)
}

// Close waits, leftCloseGrace at most, for the writes on their way and the
// undo of acquisitions whose callers left, so that a program that gives up
// and exits leaves no lock behind, then ends the rest (domain.ErrClosed)
// and closes the Store. Writes left unknown are a *domain.StoreError.
func (s *LockRepository) Close() error {
	n := s.left.quiet(leftCloseGrace)
	s.w.stop()
	var unanswered error
	if n > 0 {
		unanswered = &domain.StoreError{Op: "close the lock store", Kind: domain.StoreUnreachable,
			Advice: fmt.Sprintf("%d writes (acquires whose callers had given up, or batches) were cut or got no answer before the store closed, "+
				"so their outcome is unknown: if they committed, their locks last until their TTL; check that the server answers", n)}
	}
	return errors.Join(unanswered, s.Store.Close())
}

// leftCloseGrace bounds Close's wait; a lock committed later lasts its TTL.
const leftCloseGrace = 2 * time.Second

// DeleteOwned implements application.LockRepository, batched.
func (s *LockRepository) DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error) {
	return s.release(ctx, releaseReq{ref: ref, owner: owner})
}

// DeleteToken implements application.LockRepository as DeleteOwned does.
func (s *LockRepository) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	return s.release(ctx, releaseReq{ref: ref, token: token, now: entstore.FormatTime(now)})
}

// release runs r; a lock it removed no longer makes the resource occupied.
func (s *LockRepository) release(ctx context.Context, r releaseReq) (bool, error) {
	ok, err := s.w.release(ctx, r)
	if err != nil {
		return false, s.Failed(ctx, err, "release lock on", r.ref)
	}
	if ok {
		s.occupied.Note(r.ref, false)
	}
	return ok, nil
}

// DeleteExpired implements application.LockRepository: at most limit rows
// expired at now and on the server's clock (unless LocalTime), skipping
// those a fenced transaction holds rather than hold up Open's cleanup.
func (s *LockRepository) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	b := entsql.Dialect(dialect.Postgres)
	expired := func() *entsql.Predicate {
		p := entsql.LTE(entlock.FieldExpiresAt, entstore.FormatTime(now))
		if !s.localTime {
			p = entsql.And(p, entsql.P(func(b *entsql.Builder) { b.WriteString(serverExpired) }))
		}
		return p
	}
	batch := b.Select(entlock.FieldID).From(b.Table(entlock.Table)).Where(expired()).
		OrderBy(entlock.FieldExpiresAt).Limit(limit).
		ForUpdate(entsql.WithLockAction(entsql.SkipLocked))
	query, args := b.Delete(entlock.Table).Where(entsql.And(expired(), entsql.In(entlock.FieldID, batch))).Query()
	n, err := entstore.WriteOne(ctx, s.Store, entstore.Cleanup, func(ctx context.Context, _ *sql.Tx) (int64, error) {
		res, err := s.db.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	if err != nil {
		return int(n), s.explain(ctx, err, "clean up expired locks")
	}
	return int(n), nil
}
