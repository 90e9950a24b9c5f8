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

// LockRepository is the lock store on PostgreSQL: the shared store, whose
// Update takes a transaction of several round trips (BEGIN, the advisory
// lock, the read, the write, COMMIT), with acquires, renewals and releases
// in one statement each (application.OneStatement).
type LockRepository struct {
	*entstore.Store
	db        *sql.DB
	localTime bool // Options.LocalTime
	// occupied remembers the resources this process acquired and has not
	// released since: the same bounded hint as the Store's contention,
	// here of where a row is likely, so that a re-entry goes straight to
	// acquireSQL rather than through acquireFreeSQL first. It never
	// decides anything.
	occupied entstore.Contention
	// w runs the one-statement writes: each alone (lone), or in batches
	// when others of its kind are in flight (batches, group commit).
	w writes
	// left counts the writes whose callers left and that go on to their
	// answers (outlive), for Close.
	left *leftGroup
	// undoSQL releases one version of a lock (its id and xmin), with the
	// wake-up of a release: see undo.
	undoSQL string
	// notice is the wake-up of a lock removed, for a batch's releases
	// (releaseNotice); nil: none.
	notice func(typ, id string) string
}

var _ application.OneStatement = (*LockRepository)(nil)

// Apply implements application.OneStatement: AcquireAt, TakeAt, RenewAt
// or RenewTokenAt.
func (s *LockRepository) Apply(ctx context.Context, op application.Op) (application.Outcome, error) {
	switch op.Kind {
	case application.OpAcquire:
		return s.AcquireAt(ctx, op.Ref, op.Owner, op.At)
	case application.OpTake:
		return s.TakeAt(ctx, op.Ref, op.Owner, op.At)
	case application.OpRenew:
		return s.RenewAt(ctx, op.Ref, op.Owner, op.At)
	case application.OpRenewToken:
		return s.RenewTokenAt(ctx, op.Ref, op.Owner, op.Held.Token, op.At)
	}
	return application.Outcome{}, nil
}

// DecidesAll says that Apply leaves nothing to Update but an extension
// that its lock's expiry overtook and a renewal's refusals: the contract
// suite holds it to that.
func (s *LockRepository) DecidesAll() {}

// newLockRepository returns the store s on db, each of whose writes is
// one statement of its own; release rewrites its releases as
// Backend.ReleaseStatement does (nil: none).
func newLockRepository(s *entstore.Store, db *sql.DB, localTime bool, release func(string) string, notice func(typ, id string) string) *LockRepository {
	r := &LockRepository{Store: s, db: db, localTime: localTime, left: &leftGroup{}, undoSQL: undoVersionSQL, notice: notice}
	if release != nil {
		r.undoSQL = release(undoVersionSQL)
	}
	r.w = lone{r}
	return r
}

// writes are the one-statement writes of a LockRepository.
type writes interface {
	free(ctx context.Context, r writeReq) (inserted, error)
	acquire(ctx context.Context, r writeReq) (made, error)
	// acquireAlone runs r's statement on its own, whatever else is in
	// flight.
	acquireAlone(ctx context.Context, r writeReq) (made, error)
	renew(ctx context.Context, r writeReq) (extension, error)
	release(ctx context.Context, r releaseReq) (bool, error)
	// stop ends what is still on its way, at Close.
	stop()
}

func (s *LockRepository) explain(ctx context.Context, err error, op string) error {
	return entstore.Explain(ctx, err, op, FormatError)
}

// Close waits, leftCloseGrace at most, for the batches on their way and
// the lone acquires whose callers left to have their answers, and for the
// acquisitions of callers that left to be undone, so that a program that
// gives up on an acquire and exits leaves no lock behind. Cutting them
// sooner could cut a commit that the server completes unseen. It then
// ends the batches still on their way, whose waiting callers get an
// error that matches domain.ErrClosed, and closes the Store. It reports
// the writes that got no answer, or whose outcome stayed unknown, in a
// *domain.StoreError.
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

// leftCloseGrace bounds how long Close waits for the batches on their way
// and the lone acquires whose callers left: past it, a lock they
// committed lasts until its TTL.
const leftCloseGrace = 2 * time.Second

// DeleteOwned implements application.LockRepository: the Store's
// statement, in a batch when others are in flight, and a lock it removed
// no longer makes the resource occupied.
func (s *LockRepository) DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error) {
	ok, err := s.w.release(ctx, releaseReq{ref: ref, owner: owner})
	if err != nil {
		// The release is not known to stand: what a run that was rolled
		// back removed is there again.
		return false, s.Failed(ctx, err, "release lock on", ref)
	}
	if ok {
		s.occupied.Note(ref, false)
	}
	return ok, nil
}

// DeleteToken implements application.LockRepository as DeleteOwned does.
func (s *LockRepository) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	ok, err := s.w.release(ctx, releaseReq{ref: ref, token: token, now: entstore.FormatTime(now)})
	if err != nil {
		return false, s.Failed(ctx, err, "release lock on", ref)
	}
	if ok {
		s.occupied.Note(ref, false)
	}
	return ok, nil
}

// DeleteExpired implements application.LockRepository: the Store's purge,
// which removes at most limit expired rows, with two tests of its own.
//
// A row must have expired on the server's clock too (unless LocalTime):
// now is the host's estimate of the server's time, which a link slower
// one way than the other can put seconds ahead, and a cleanup must never
// purge a lock that is still active on the server (another host would
// then take it before its expiry).
//
// The subquery locks the rows it chooses, FOR UPDATE SKIP LOCKED: a row
// that another transaction holds is left for a later cleanup rather than
// waited for. A fenced transaction holds its lock's row (FOR KEY SHARE)
// until it ends, and may run on past the lock's expiry: the lock does not
// change hands meanwhile, and a cleanup that waited for it held up the
// Open of every new container (its startup cleanup) for as long as the
// transaction ran. The row a cleanup then deletes is one it has locked,
// tested again by the DELETE's own WHERE, so skipping decides nothing on
// a weaker test.
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
