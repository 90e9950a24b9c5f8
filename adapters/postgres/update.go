package entstore

import (
	"context"
	"errors"
	"sync"

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
// which, as a lone acquire (runOne), does not end with its caller's
// context. Cut during its COMMIT, it could commit unseen, and a takeover
// (of an expired lock, of a dead holder's) would hold the resource for a
// caller told that it failed. When the caller leaves, it returns at once
// with the context's error, and the transaction goes on, leftTimeout at
// most: if it had not decided yet, or its caller left while it decided,
// it writes nothing; if it inserted a lock, that acquisition is undone by
// its token and row version, so that a later re-entry of the same owner
// is spared. A renewal or a re-entry that commits stands, as in a batch
// (outlive). These
// transactions count among the maxLeft that may outlive their callers;
// past the bound, the transaction is cut as before, and undone only if
// its answer still says that it inserted. Close waits for them as for the
// lone acquires.
func (s *PostgresStore) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	if err := ctx.Err(); err != nil {
		return domain.Lock{}, s.failed(ctx, err, "update lock on", ref)
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
	a, ok := outlive(ctx, s.batch.group, func(run context.Context) (a answer) {
		defer func() {
			if p := recover(); p != nil {
				a.panicked, a.panic = true, p
			}
			mu.Lock()
			a.change = last
			mu.Unlock()
		}()
		a.lock, a.err = s.Store.update(run, ref, track, &a.version)
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
			if s.batching.Unwritten != nil && s.batching.Unwritten(a.err) {
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
		return domain.Lock{}, s.failed(ctx, ctx.Err(), "update lock on", ref)
	case a.panicked:
		panic(a.panic)
	case errors.Is(a.err, errCallerLeft):
		return domain.Lock{}, s.failed(ctx, ctx.Err(), "update lock on", ref)
	}
	return a.lock, a.err
}
