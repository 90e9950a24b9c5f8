package locks

import (
	"context"
	"database/sql"
	"errors"

	"github.com/cleveragents/locks/domain"
)

// appWriter runs an application's write transaction in the lock store's
// queue of writers (Container.Write); nil for a store that has none.
type appWriter func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error

// errNoWriter is why Write cannot work on a store other than SQLite.
var errNoWriter = errors.New("Container.Write serves the SQLite lock store, whose file has one write lock for " +
	"every writer; on PostgreSQL run the transaction on the application's own connection pool, " +
	"and on MemoryDatabase there is no SQL database to write")

// Write runs fn in a write transaction on the container's SQLite file and
// commits it when fn returns nil (it rolls back otherwise): the way for
// the application to write its own tables in the file that holds the
// locks. The transaction joins the queue of the lock store's own writes,
// in this process (in arrival order) and across processes (the file lock
// beside the database), so that a stream of the application's writes can
// no longer keep the store's renewals out until a kept-alive lock expires,
// as transactions on the application's own *sql.DB can: those wait in
// SQLite's busy handler, outside the queue. docs/lifecycle.md says when
// to use which.
//
// fn runs with the database's only write lock held: keep it short. It may
// run again when the database was busy, and must start from nothing each
// time. It may call CheckFence on tx, but must not take or release locks:
// such a call waits for fn's own transaction, which cannot commit until
// the call returns. Made with the context fn is given, it is refused at
// once (a *domain.StoreError). Made with any other context (a closure
// that captures the caller's ctx), it cannot be told from another
// goroutine's call waiting its turn, and behaves as a nested
// sync.Mutex.Lock: it waits until that context ends and returns its error
// (saying that it waited behind an application transaction), or never
// returns if it never ends, and all the while fn holds the file's only
// write lock, so that every lock operation of every process waits and
// kept-alive locks expire. Take and release locks before or after Write.
// fn runs on whichever goroutine leads the queue, with ctx's values but
// not its cancellation; when ctx ends meanwhile, the transaction is
// rolled back once fn returns.
//
// Errors: fn's own error, as it returned it; ctx's error when ctx ends
// before the commit (the changes are undone); domain.ErrClosed once Close
// has begun; a *domain.StoreError when the transaction fails (StoreBusy,
// StoreFull, ...) and, of kind StoreInternal, on PostgreSQL and
// MemoryDatabase.
func (c *Container) Write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if c.write == nil {
		return &domain.StoreError{Op: "application write", Kind: domain.StoreInternal, Err: errNoWriter}
	}
	if c.closing.Load() {
		return domain.ErrClosed
	}
	err := c.write(ctx, fn)
	if err != nil && c.closing.Load() && domain.IsStoreKind(err, domain.StoreInternal) {
		return errors.Join(domain.ErrClosed, err) // the store closed under it
	}
	return err
}
