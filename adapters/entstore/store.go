// Package entstore is what the SQL adapters share: the lock repository
// over the Ent schema, written in the adapter's dialect and run through
// the adapter's Backend, half the fence check, and the migrations' books.
package entstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/ent"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// Backend is what a database adds to the shared store.
type Backend struct {
	Dialect string // Ent's name of the database
	// WriteTx runs body in a write transaction (tx nil: a single statement
	// alone) and commits it, again after a busy database or a rollback; a
	// shared transaction ignores ctx's cancellation, which would end others'.
	// Errors: ctx's before the commit (changes undone), body's, the
	// transaction's; nil only when body's last run committed.
	WriteTx  func(ctx context.Context, kind WriteKind, body func(ctx context.Context, tx *sql.Tx) error) error
	SharedTx bool // WriteTx shares transactions: keep statements bound to one
	// Read, when set, runs fn, again while its connection ended, returning fn's last error.
	Read        func(ctx context.Context, fn func(context.Context) error) error
	FormatError func(op string, err error) error // the database's errors as domain errors
	// Released, when set, is told without blocking after each commit that
	// removed locks which may have been active (no refs: any); not after purges.
	Released func(refs ...domain.ResourceRef)
	// ReleaseStatement, when set, rewrites a release's DELETE into one that
	// also sends wake-ups at its commit, with the same rows affected.
	ReleaseStatement func(deleteSQL string) string
	// Replaced, when set, is told after each commit of an Update that
	// replaced a lock with another (a takeover), whose holder may watch
	// for it; nil: Released is told.
	Replaced func(ctx context.Context, ref domain.ResourceRef)
}

// replaced tells the holders watching ref that its lock was replaced.
func (b Backend) replaced(ctx context.Context, ref domain.ResourceRef) {
	switch {
	case b.Replaced != nil:
		b.Replaced(ctx, ref)
	case b.Released != nil:
		b.Released(ref)
	}
}

func (b Backend) releasing(deleteSQL string) string {
	if b.ReleaseStatement == nil {
		return deleteSQL
	}
	return b.ReleaseStatement(deleteSQL)
}

// WriteKind says what a write body runs, for Backend.WriteTx.
type WriteKind int

// Statements is a body of several (a savepoint in a shared transaction);
// OneStatement one, which may run alone. Cleanup, a purge, may wait.
const (
	Statements WriteKind = iota
	OneStatement
	Cleanup
)

// Store implements application.LockRepository, safe for concurrent use.
type Store struct {
	read, write *sql.DB
	readEnt     *ent.Client
	b           Backend
	text        statementText
	stmts       stmts
	// noteless: the locks table has no note column (a database that only
	// an earlier release has opened, inspected by NewReadOnly).
	noteless  bool
	contended Contention
	// bound keeps the statements bound to the last shared transaction
	// (tx.StmtContext per write cost 7% of a batch); tx keeps its address from reuse.
	bound struct {
		sync.Mutex
		tx    *sql.Tx
		stmts map[*sql.Stmt]*sql.Stmt
	}
}

var _ application.LockRepository = (*Store)(nil)

func newStore(read *sql.DB, b Backend) *Store {
	return &Store{read: read, b: b, text: buildStatements(b.Dialect),
		readEnt: ent.NewClient(ent.Driver(entsql.OpenDB(b.Dialect, read)))}
}

// New returns the store that reads through read and writes through write,
// with the hot-path statements prepared on each.
func New(ctx context.Context, read, write *sql.DB, b Backend) (*Store, error) {
	s := newStore(read, b)
	s.write = write
	s.text.delOwned, s.text.delToken = b.releasing(s.text.delOwned), b.releasing(s.text.delToken)
	if err := s.prepare(ctx); err != nil {
		s.Close()
		return nil, b.FormatError("prepare statements", err)
	}
	return s, nil
}

// NewReadOnly returns a store for inspection, which prepares nothing (the
// locks table may be missing) and migrates nothing: on a database that no
// release with the note column has opened, it reads the locks without
// notes. Its writes fail with StoreReadOnly.
func NewReadOnly(ctx context.Context, read *sql.DB, b Backend) *Store {
	b.WriteTx = func(context.Context, WriteKind, func(context.Context, *sql.Tx) error) error {
		return &domain.StoreError{Op: "write", Kind: domain.StoreReadOnly, Err: errors.New("opened for inspection only")}
	}
	s := newStore(read, b)
	if !s.hasNote(ctx) {
		s.noteless = true
		s.text.sel = selectLock(b.Dialect, lockColumns(false))
	}
	return s
}

// hasNote reports whether the locks table has the note column: false only
// when the database says that a table or column is missing, so that a read
// that fails for another reason reports its own failure.
func (s *Store) hasNote(ctx context.Context) bool {
	b := entsql.Dialect(s.b.Dialect)
	query, _ := b.Select(entlock.FieldNote).From(b.Table(entlock.Table)).Limit(0).Query()
	err := s.reading(ctx, func(ctx context.Context) error {
		rows, err := s.read.QueryContext(ctx, query)
		if err == nil {
			err = rows.Close()
		}
		return err
	})
	return err == nil || !domain.IsStoreKind(s.b.FormatError("read the columns of "+entlock.Table, err), domain.StoreSchema)
}

// Close releases the prepared statements, not the adapter's connections.
func (s *Store) Close() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.stmts.read, s.stmts.sel, s.stmts.insert, s.stmts.extend, s.stmts.delID, s.stmts.delOwned, s.stmts.delToken} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// WriteOne runs body through WriteTx and returns what its committed run
// returned, never what a rolled-back run left behind.
func WriteOne[T any](ctx context.Context, s *Store, kind WriteKind, body func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	var out T
	err := s.b.WriteTx(ctx, kind, func(ctx context.Context, tx *sql.Tx) (err error) {
		out, err = body(ctx, tx)
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}

// RunTx runs fn in a transaction of its own on db and commits it, rolling
// back when fn fails or panics: one left open would hold its locks for good.
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
		// ErrTxDone: the database ended the transaction itself.
		if rerr := tx.Rollback(); rerr != nil && err != nil && !errors.Is(rerr, sql.ErrTxDone) {
			err = errors.Join(err, rerr)
		}
	}()
	if err = fn(ctx, tx); err != nil {
		return err
	}
	committed = true
	return tx.Commit()
}

func (s *Store) reading(ctx context.Context, fn func(context.Context) error) error {
	if s.b.Read == nil {
		return fn(ctx)
	}
	return s.b.Read(ctx, fn)
}

// Failed explains err, if any, as a failure of what on ref.
func (s *Store) Failed(ctx context.Context, err error, what string, ref domain.ResourceRef) error {
	if err == nil {
		return nil
	}
	return s.explain(ctx, err, what+" "+ref.String())
}

func (s *Store) explain(ctx context.Context, err error, op string) error {
	return Explain(ctx, err, op, s.b.FormatError)
}

// Explain translates err, a failure of op, with format, unless ctx ended or
// its deadline passed: the driver's words for that would read as a store failure.
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

const maxContended = 4096 // then Contention starts over

// Contention remembers resources just refused: a hint, never a decision.
type Contention struct {
	mu   sync.Mutex
	refs map[domain.ResourceRef]struct{}
}

// Has says whether ref is remembered.
func (c *Contention) Has(ref domain.ResourceRef) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.refs[ref]
	return ok
}

// Note remembers ref, or forgets it.
func (c *Contention) Note(ref domain.ResourceRef, refused bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !refused:
		delete(c.refs, ref)
	case c.refs == nil || len(c.refs) >= maxContended:
		c.refs = map[domain.ResourceRef]struct{}{ref: {}}
	default:
		c.refs[ref] = struct{}{}
	}
}

// Contended is the store's memory of the resources just refused.
func (s *Store) Contended() *Contention { return &s.contended }

// Retry runs fn up to attempts times while retryable accepts its error,
// pausing about 5 ms * 2^attempt, jittered; it returns fn's error or ctx's.
func Retry(ctx context.Context, attempts int, retryable func(error) bool, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || !retryable(err) || attempt >= attempts {
			return err
		}
		// A real timer: it paces I/O, not lock expiry.
		base := time.Duration(1<<attempt) * 5 * time.Millisecond
		t := time.NewTimer(base/2 + rand.N(base))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// timeLayout has a fixed width, so that string order is time order in SQL.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// FormatTime writes t in timeLayout, by hand for years 0-9999 (time.Format
// was 5% of an acquire's hold of the write lock).
func FormatTime(t time.Time) string {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.Format(timeLayout)
	}
	hour, minute, sec := t.Clock()
	b := []byte(timeLayout)
	for _, f := range [...]struct{ at, width, v int }{
		{0, 4, year}, {5, 2, int(month)}, {8, 2, day}, {11, 2, hour},
		{14, 2, minute}, {17, 2, sec}, {20, 6, t.Nanosecond() / 1000},
	} {
		for i := f.at + f.width - 1; i >= f.at; i-- {
			b[i] = byte('0' + f.v%10)
			f.v /= 10
		}
	}
	return string(b)
}

// ParseTime reads s, a time as stored in column.
func ParseTime(column, s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("column %s holds %q, not a time in the form %s", column, s, timeLayout)
	}
	return t, nil
}

// ParseTimes sets l's times from their stored form.
func ParseTimes(l *domain.Lock, acquired, expires string) (err error) {
	if l.AcquiredAt, err = ParseTime(entlock.FieldAcquiredAt, acquired); err == nil {
		l.ExpiresAt, err = ParseTime(entlock.FieldExpiresAt, expires)
	}
	if err != nil {
		return &domain.StoreError{Op: "read lock", Kind: domain.StoreCorrupt, Err: err}
	}
	return nil
}

// On returns st bound to tx, or st itself for tx nil.
func (s *Store) On(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	switch {
	case tx == nil:
		return st
	case !s.b.SharedTx:
		return tx.StmtContext(ctx, st)
	}
	b := &s.bound
	b.Lock()
	defer b.Unlock()
	if b.tx != tx {
		b.tx = tx
		clear(b.stmts)
	}
	if bound, ok := b.stmts[st]; ok {
		return bound
	}
	if b.stmts == nil {
		b.stmts = make(map[*sql.Stmt]*sql.Stmt)
	}
	bound := tx.StmtContext(ctx, st)
	b.stmts[st] = bound
	return bound
}
