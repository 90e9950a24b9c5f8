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

// rowVersionSQL reads the row version (xmin) of the lock $1, for undo.
var rowVersionSQL = pgStatement(`SELECT xmin::text FROM {locks} WHERE {id} = $1::bigint`)

// errCallerLeft ends an Update whose caller left before it decided.
var errCallerLeft = errors.New("the caller left before the decision stood")

// Update implements application.LockRepository: the Store's transaction,
// behind the resource's advisory lock (txSteps). It outlives its caller,
// since a COMMIT cut unseen could leave a takeover for a caller told it
// failed: undecided, it writes nothing; an insert is undone.
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
			// The caller left while it decided: nothing is written.
			gone = true
			return application.Change{}, errCallerLeft
		}
		last = c
		return c, err
	}
	type answer struct {
		lock     domain.Lock
		err      error
		change   application.Change
		version  string
		panicked bool // decide panicked: rolled back, and the panic goes on
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
		// Whether the outcome is known: nothing written, a change that stands, or an insert undone.
		switch {
		case a.panicked:
			panic(a.panic)
		case a.err != nil:
			if unwritten(a.err) {
				return true
			}
			// The decision's errors wrote nothing; the store's and a cut's may have.
			var se *domain.StoreError
			return !errors.As(a.err, &se) && !errors.Is(a.err, context.Canceled) && !errors.Is(a.err, context.DeadlineExceeded)
		case a.change.Kind != application.ChangeInsert || a.version == "":
			return true
		default:
			return s.undo(ref, a.lock.Token, a.version)
		}
	})
	if a.panicked {
		panic(a.panic)
	}
	if !ok || errors.Is(a.err, errCallerLeft) {
		return domain.Lock{}, s.Failed(ctx, ctx.Err(), "update lock on", ref)
	}
	return a.lock, a.err
}

// txSteps are an Update's steps on ref: the advisory lock first, a change of
// hands refused on the server's clock (unless LocalTime), the row version for undo.
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
// expired at now while it is active on the server's clock, as acquireSQL
// would. Replacing a lock active at now (a dead holder's) goes ahead.
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
