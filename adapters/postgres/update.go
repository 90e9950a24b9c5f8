package postgres

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// rowVersionSQL reads the row version (xmin) of the lock $1, as
// undoVersionSQL names it.
var rowVersionSQL = pgStatement(`SELECT xmin::text FROM {locks} WHERE {id} = $1::bigint`)

// errCallerLeft ends an Update whose caller left before it decided:
// nothing is written.
var errCallerLeft = errors.New("the caller left before the decision stood")

// Update implements application.LockRepository: the Store's transaction,
// behind the resource's advisory lock (txSteps), which, as a lone acquire
// (runOne), does not end with its caller's
// context. Cut during its COMMIT, it could commit unseen, and a takeover
// (of an expired lock, of a dead holder's) would hold the resource for a
// caller told that it failed. When the caller leaves, it returns at once
// with the context's error, and the transaction goes on, leftTimeout at
// most: if it had not decided yet, or its caller left while it decided,
// it writes nothing; if it inserted a lock, that acquisition is undone by
// its token and row version, so that a later re-entry of the same owner
// is spared. A renewal or a re-entry that commits stands, as in a batch
// (outlive). These transactions count among the maxLeft that may outlive
// their callers; past the bound, the transaction is cut, and undone only
// if its answer still says that it inserted. Close waits for them as for
// the lone acquires.
func (s *LockRepository) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	if err := ctx.Err(); err != nil {
		return domain.Lock{}, s.Failed(ctx, err, "update lock on", ref)
	}
	var (
		mu   sync.Mutex
		gone bool               // the caller left: decide no more
		last application.Change // the last decision, the one that stands
	)
	track := func(cur *domain.Lock) (application.Change, error) {
		mu.Lock()
		defer mu.Unlock()
		if gone {
			return application.Change{}, errCallerLeft
		}
		c, err := decide(cur)
		if ctx.Err() != nil {
			// The caller left while it decided: the decision is nobody's,
			// and the transaction ends with nothing written.
			gone = true
			return application.Change{}, errCallerLeft
		}
		last = c
		return c, err
	}
	type answer struct {
		lock    domain.Lock
		err     error
		change  application.Change
		version string
		// panicked: decide panicked (the transaction was rolled back);
		// the panic goes on to the caller, or, gone, where it was caught.
		panicked bool
		panic    any
	}
	a, ok := outlive(ctx, s.left, func(run context.Context) (a answer) {
		defer func() {
			if p := recover(); p != nil {
				a.panicked, a.panic = true, p
			}
			mu.Lock()
			a.change = last
			mu.Unlock()
		}()
		a.lock, a.version, a.err = s.Store.UpdateTx(run, ref, track, s.txSteps(ref))
		return a
	}, func() {
		mu.Lock()
		gone = true // a decision taken from now on would be nobody's
		mu.Unlock()
	}, func(a answer) bool {
		// Whether the outcome is known to leave nothing for the caller:
		// an error of the decision (nothing written), a change that
		// stands, or an insert undone.
		switch {
		case a.panicked:
			panic(a.panic)
		case a.err != nil:
			if unwritten(a.err) {
				return true
			}
			// The decision's own errors wrote nothing; the store's and a
			// cut's leave the outcome unknown.
			var se *domain.StoreError
			return !errors.As(a.err, &se) && !errors.Is(a.err, context.Canceled) && !errors.Is(a.err, context.DeadlineExceeded)
		case a.change.Kind != application.ChangeInsert || a.version == "":
			return true
		default:
			return s.undo(ref, a.lock.Token, a.version)
		}
	})
	switch {
	case !ok:
		return domain.Lock{}, s.Failed(ctx, ctx.Err(), "update lock on", ref)
	case a.panicked:
		panic(a.panic)
	case errors.Is(a.err, errCallerLeft):
		return domain.Lock{}, s.Failed(ctx, ctx.Err(), "update lock on", ref)
	}
	return a.lock, a.err
}

// txSteps are PostgreSQL's steps in an Update's transaction on ref: it
// takes the resource's advisory lock first, refuses a change of hands
// that the server's clock does not allow (unless LocalTime), and reads
// the row version of a lock it inserts, for undo.
func (s *LockRepository) txSteps(ref domain.ResourceRef) entstore.TxSteps {
	t := entstore.TxSteps{
		First: func(ctx context.Context, tx *sql.Tx) error { return lockResource(ctx, tx, ref) },
		Inserted: func(ctx context.Context, tx *sql.Tx, l domain.Lock) (string, error) {
			var version string
			err := tx.QueryRowContext(ctx, rowVersionSQL, l.Token).Scan(&version)
			return version, err
		},
	}
	if !s.localTime {
		t.Replacing = changeOfHandsOnServer
	}
	return t
}

// changeOfHandsOnServer refuses a change of hands that took cur for
// expired at the decision's now (the new lock's acquisition time: the
// host's estimate of the server's time, which can run ahead of it) while
// it is still active on the server's own clock, read in tx: the
// statements that take over and purge test that clock too (acquireSQL),
// and Update must not take what they would not. A replacement decided at
// a now when cur was active, a dead holder's, is the caller's deliberate
// choice and goes ahead. The refusal is the conflict that the server's
// clock decides.
func changeOfHandsOnServer(ctx context.Context, tx *sql.Tx, cur *domain.Lock, change application.Change) error {
	if !cur.ExpiredAt(change.Lock.AcquiredAt) {
		return nil
	}
	server, err := serverNow(ctx, tx)
	if err != nil {
		return err
	}
	if cur.ExpiredAt(server) {
		return nil
	}
	return &domain.LockConflictError{Holder: *cur, Now: server, SameOwner: cur.Owner == change.Lock.Owner}
}
