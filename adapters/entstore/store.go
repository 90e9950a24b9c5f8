// Package entstore is what the SQL databases share: the repository over
// the Ent schema, its statements written by Ent's builder in the
// adapter's dialect, its transactions, the part of a fence check that
// does not depend on the database, and the migrations' bookkeeping. It
// knows no database: an adapter (sqlite, postgres) opens the connections,
// applies its migrations and supplies a Backend (how it runs and retries
// writes, and explains its errors), and adds its own statements on top.
package entstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/ent"
)

// Backend is what a database adds to the shared store.
type Backend struct {
	// Dialect is Ent's name of the database, in which the store's
	// statements are written.
	Dialect string
	// WriteTx runs every write of the store. For kind Statements it
	// begins a write transaction, runs body in it and commits; for a
	// single statement it may run body alone, with tx nil. It applies the
	// database's queueing and retry policy. It may run the bodies of
	// concurrent calls in one transaction and one commit (group commit,
	// SharedTx); each body must then be atomic on its own (a savepoint),
	// one body's failure must roll back nothing but its own changes, and
	// no call may return before the commit that made its changes durable.
	// body then runs with a context that carries ctx's values but not its
	// cancellation (so that one caller giving up cannot interrupt a
	// transaction that others share); WriteTx itself answers with ctx's
	// error when ctx ends before body's changes are committed, and undoes
	// them. body must be safe to run again: WriteTx runs it again when the
	// database was busy, or the transaction it ran in was rolled back (a
	// busy COMMIT; in a shared transaction, another body whose failure
	// ended it), in a new transaction. WriteTx returns body's error as it
	// is, or the transaction's: the store explains it with FormatError,
	// and builds that message only when there is one. It returns nil only
	// when body's last run returned nil and that run's changes committed.
	//
	// kind says what the body runs, and so what it needs (see WriteKind).
	WriteTx func(ctx context.Context, kind WriteKind, body func(ctx context.Context, tx *sql.Tx) error) error
	// SharedTx says that WriteTx runs the bodies of concurrent calls in
	// one transaction at a time: the statements bound to it are then kept
	// for the other bodies of that transaction.
	SharedTx bool
	// Read, when set, runs one read, fn, and runs it again while it fails
	// in a way that another connection may not: the connection ended
	// under it (a server's backend terminated by an operator). It returns
	// fn's last error as it is. Nil runs fn once.
	Read func(ctx context.Context, fn func(context.Context) error) error
	// FormatError translates the database's errors into domain errors.
	FormatError func(op string, err error) error
	// Released, when set, is told after the commit of every write that
	// removed locks which may have been active: the lock on each of refs,
	// or, with none, any lock. It must not block. A database that sends
	// its wake-ups inside the transaction (ReleaseStatement) leaves it
	// nil. A purge removes only expired locks, which waiters take at the
	// expiry they already wait for, and is not reported.
	Released func(refs ...domain.ResourceRef)
	// ReleaseStatement, when set, rewrites each statement that removes
	// locks which may have been active (a release by owner or by token, a
	// release of all an owner's locks: a DELETE of the locks table, with
	// its parameters, and no RETURNING) into the statement the store runs
	// instead. That statement sends the database's wake-ups inside the
	// transaction, so that they are delivered at its commit and only if it
	// commits, at no extra round trip; its rows affected must still be the
	// rows the DELETE removed. The purge of expired locks is not rewritten,
	// as it is not reported to Released.
	ReleaseStatement func(deleteSQL string) string
}

// releasing returns the statement that runs the release deleteSQL: the
// backend's rewrite of it, if it has one.
func (b Backend) releasing(deleteSQL string) string {
	if b.ReleaseStatement == nil {
		return deleteSQL
	}
	return b.ReleaseStatement(deleteSQL)
}

// WriteKind says what a write body runs, for Backend.WriteTx.
type WriteKind int

const (
	// Statements: several statements, which a shared transaction must
	// make atomic on their own (a savepoint).
	Statements WriteKind = iota
	// OneStatement: a single statement, atomic by itself, that may run
	// alone outside any transaction (tx nil), where BEGIN and COMMIT
	// would only add to its cost.
	OneStatement
	// OneDatedStatement: a single statement that reads the clock before
	// it runs. It needs no savepoint, but alone it still runs in a
	// transaction, whose BEGIN waits for the database's write lock: the
	// clock is then read after the wait, not before it.
	OneDatedStatement
	// Cleanup: a single statement of a purge of expired locks, which
	// changes many pages; otherwise like OneStatement. A backend may keep
	// costly upkeep (a checkpoint's end) out of the way while purges run.
	Cleanup
)

// Store implements application.LockRepository. It is safe for concurrent
// use.
type Store struct {
	read, write *sql.DB
	readEnt     *ent.Client
	b           Backend
	text        statementText // the hot path's SQL in b.Dialect
	stmts       stmts
	contended   Contention
	bound       boundStmts
}

var _ application.LockRepository = (*Store)(nil)

// New returns the store that reads through read and writes through write,
// with the hot-path statements prepared on each.
func New(ctx context.Context, read, write *sql.DB, b Backend) (*Store, error) {
	s := &Store{
		read: read, write: write, b: b, text: buildStatements(b.Dialect),
		readEnt: ent.NewClient(ent.Driver(entsql.OpenDB(b.Dialect, read))),
	}
	s.text.delOwned, s.text.delToken = b.releasing(s.text.delOwned), b.releasing(s.text.delToken)
	if err := s.prepare(ctx); err != nil {
		s.Close()
		return nil, b.FormatError("prepare statements", err)
	}
	return s, nil
}

// NewReadOnly returns a store that only reads, through read, and prepares
// nothing (the locks table may be missing: it is for inspection). Its
// writes fail with a StoreError of kind StoreReadOnly.
func NewReadOnly(read *sql.DB, b Backend) *Store {
	b.WriteTx = func(context.Context, WriteKind, func(context.Context, *sql.Tx) error) error {
		return &domain.StoreError{Op: "write", Kind: domain.StoreReadOnly, Err: errors.New("opened for inspection only")}
	}
	return &Store{read: read, b: b, text: buildStatements(b.Dialect),
		readEnt: ent.NewClient(ent.Driver(entsql.OpenDB(b.Dialect, read)))}
}

// Close releases the prepared statements. The connections belong to the
// adapter, which closes them.
func (s *Store) Close() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.stmts.read, s.stmts.sel, s.stmts.insert, s.stmts.extend, s.stmts.delID, s.stmts.delOwned, s.stmts.delToken} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// A write's body may run more than once: the backend runs it again when
// the database was busy, and a group commit runs every body of a batch
// again when the batch's transaction was rolled back (a busy COMMIT, a
// member whose failure ended the transaction). Only the last run's
// changes are committed, so only the last run's outcome may reach the
// caller. Each body therefore returns its outcome, and the functions
// below keep only what the last run returned: a body never writes to a
// variable of its caller, where a run that was rolled back would leave
// its decision behind (an insert's token, a refusal) for the run that
// counts.

// WriteOne runs body, a write of one statement of the given kind
// (OneStatement, OneDatedStatement or Cleanup), through the backend's
// WriteTx, and returns what its last run returned. tx is nil where the
// backend runs the statement alone.
func WriteOne[T any](ctx context.Context, s *Store, kind WriteKind, body func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	return lastRun(body, func(run func(context.Context, *sql.Tx) error) error {
		return s.b.WriteTx(ctx, kind, run)
	})
}

// inTx runs body in one write transaction, after first (unless nil), and
// returns what its last run returned.
func inTx[T any](ctx context.Context, s *Store, first func(context.Context, *sql.Tx) error, body func(context.Context, *sql.Tx) (T, error)) (T, error) {
	if first != nil {
		locked := body
		body = func(ctx context.Context, tx *sql.Tx) (T, error) {
			if err := first(ctx, tx); err != nil {
				var zero T
				return zero, err
			}
			return locked(ctx, tx)
		}
	}
	return lastRun(body, func(run func(context.Context, *sql.Tx) error) error {
		return s.b.WriteTx(ctx, Statements, run)
	})
}

// lastRun runs body through write, which may run it several times, and
// returns the outcome of its last run, which write reports as the one
// that stands (see Backend.WriteTx), or write's error. Every run starts
// from the zero outcome.
func lastRun[T any](body func(context.Context, *sql.Tx) (T, error), write func(run func(context.Context, *sql.Tx) error) error) (T, error) {
	var out T
	err := write(func(ctx context.Context, tx *sql.Tx) error {
		var zero T
		out = zero
		v, err := body(ctx, tx)
		if err != nil {
			return err
		}
		out = v
		return nil
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}

// RunTx runs fn in a transaction of its own on db and commits it. The
// transaction always ends: it is rolled back when fn fails and also when
// fn panics (a Decide function that panics inside a recovering server),
// before the panic goes on; a transaction left open would hold the
// database's write lock, or a lock on the resource, for good.
func RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(context.Context, *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		if rerr := ignoreDone(tx.Rollback()); rerr != nil && err != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	committed = true
	return tx.Commit()
}

// reading runs the read fn through the backend's Read.
func (s *Store) reading(ctx context.Context, fn func(context.Context) error) error {
	if s.b.Read == nil {
		return fn(ctx)
	}
	return s.b.Read(ctx, fn)
}

// Failed explains err, when there is one, naming the operation on ref;
// the message is built only then, never on the way of a write that worked.
func (s *Store) Failed(ctx context.Context, err error, what string, ref domain.ResourceRef) error {
	if err == nil {
		return nil
	}
	return s.explain(ctx, err, what+" "+ref.String())
}

// explain translates a failure of operation op with the backend's
// FormatError; see Explain.
func (s *Store) explain(ctx context.Context, err error, op string) error {
	return Explain(ctx, err, op, s.b.FormatError)
}

// Explain translates err, a failure of operation op, with format, except
// when ctx ended meanwhile: the driver then reports the interruption in
// its own words (SQLite's "interrupted", or sql.ErrTxDone from a commit
// whose transaction database/sql already rolled back), which would read
// as a store failure. The caller learns that its context ended, as it
// does when ctx ends before the call. A deadline that has passed counts
// as ended even before ctx's timer says so: the driver's own timeouts,
// which it derives from the same deadline (a dial's, a socket's), can
// fire a moment earlier, and their "i/o timeout" would read as a server
// that cannot be reached.
func Explain(ctx context.Context, err error, op string, format func(op string, err error) error) error {
	cerr := ctx.Err()
	// Real time, not the service's clock: a context's deadline is on it.
	if d, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(d) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil {
		if errors.Is(err, cerr) {
			return err
		}
		return fmt.Errorf("%s: %w (the store reported: %v)", op, cerr, err)
	}
	return format(op, err)
}

// ignoreDone drops the error of rolling back a transaction that the
// database already ended (SQLite does so itself after some failures).
func ignoreDone(err error) error {
	if err == nil || errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
