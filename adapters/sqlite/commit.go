package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
)

const (
	// maxBatch bounds a batch, and so the wait of the callers behind it.
	maxBatch = 64
	// gatherRounds bounds the yields that let callers woken by the last
	// commit queue before the leader claims (32 callers: batches of 6 → 12).
	gatherRounds = 8
	// transaction is the kind of an application's Write, which runs alone.
	transaction entstore.WriteKind = -1
)

// runsAlone reports whether a write of kind k is never batched with others.
func runsAlone(k entstore.WriteKind) bool { return k == entstore.Cleanup || k == transaction }

// committer runs the writes of one DB with group commit: the writes that
// arrive while a transaction is under way share the next one and its
// commit. The caller at the head of the queue leads, runs batches until
// its own call is done, then hands the lead on. Every call returns after
// its batch's COMMIT: no caller is told of a token not committed.
type committer struct {
	db         *DB
	savepoints *savepoints

	mu      sync.Mutex
	queue   []*txCall // not yet claimed, in arrival order
	leading bool
	appTx   bool // the batch under way is an application's Write (see await)
	busy    bool // the last batch was shared: its callers are about to queue again
	stats   WriteStats
	// calls counts the calls in run: queued, in a batch, or told their
	// outcome and not yet returned (who are about to write again, often).
	calls atomic.Int32
}

// txCall is one write waiting for, or taken into, a batch.
type txCall struct {
	ctx  context.Context
	body func(context.Context, *sql.Tx) error
	kind entstore.WriteKind

	// Set by the leader, read by the caller once done is closed.
	err      error
	panicked bool
	panicVal any

	done, lead     chan struct{} // closed: the outcome is final; the caller is to lead
	claimed, leads bool          // under committer.mu; leads: lead was closed
}

// errBodyPanicked marks a body that panicked; its caller panics again.
var errBodyPanicked = errors.New("write panicked")

// run implements entstore.Backend.WriteTx.
func (c *committer) run(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctx.Value(inWrite{}) != nil {
		return errNestedWrite
	}
	c.calls.Add(1)
	defer c.calls.Add(-1)
	call := &txCall{ctx: ctx, body: body, kind: kind, done: make(chan struct{}), lead: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, call)
	first := !c.leading
	c.leading = true
	c.mu.Unlock()
	if first || c.await(call) {
		c.leadUntilDone(call)
	}
	if call.panicked {
		panic(call.panicVal)
	}
	return call.err
}

// await waits until call is done, or its caller is to lead (true). A call
// whose context ends is withdrawn, unless claimed: its change may be in
// the transaction, so it waits for the batch's outcome.
func (c *committer) await(call *txCall) bool {
	select {
	case <-call.done:
		return false
	case <-call.lead:
		return true
	case <-call.ctx.Done():
	}
	c.mu.Lock()
	if call.claimed {
		c.mu.Unlock()
		<-call.done
		return false
	}
	c.queue = slices.DeleteFunc(c.queue, func(q *txCall) bool { return q == call })
	call.err = call.ctx.Err()
	if c.appTx {
		call.err = fmt.Errorf("%w: %s", call.err, waitedBehindWrite)
	}
	if call.leads {
		c.passLead()
	}
	c.mu.Unlock()
	return false
}

// leadUntilDone runs batches until one has claimed call, then passes the lead.
func (c *committer) leadUntilDone(call *txCall) {
	for {
		c.runBatch()
		c.mu.Lock()
		if call.claimed {
			c.passLead()
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// passLead makes the head of the queue the leader, if any. c.mu must be held.
func (c *committer) passLead() {
	if len(c.queue) == 0 {
		c.leading = false
		return
	}
	c.queue[0].leads = true
	close(c.queue[0].lead)
}

// aloneWithOneStatement reports whether the next batch is one statement:
// a purge's, or the only call in run while no shared batch just ended.
// A call queued alone while others are still returning from the last
// batch would start a run of lone commits, each of which the others miss
// by a moment (32 callers: 57 % of transactions had one write, 10 writes
// a transaction on average; counting the returning calls, 17).
func (c *committer) aloneWithOneStatement() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return false
	}
	kind := c.queue[0].kind
	return kind == entstore.Cleanup || len(c.queue) == 1 && kind == entstore.OneStatement && !c.busy && c.calls.Load() == 1
}

// gather lets ready callers queue their writes, while more keep coming.
func (c *committer) gather() {
	last := c.queued()
	for range gatherRounds {
		runtime.Gosched()
		n := c.queued()
		if n == last || n >= maxBatch {
			return
		}
		last = n
	}
}

func (c *committer) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// claim takes the next batch off the queue: up to maxBatch calls from its
// head, but a purge's write (which holds the write lock for a millisecond
// or more) or an application's transaction alone.
func (c *committer) claim() []*txCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.queue), maxBatch)
	for i := range n {
		if runsAlone(c.queue[i].kind) {
			n = max(i, 1) // alone at the head, or up to it
			break
		}
	}
	batch := slices.Clone(c.queue[:n])
	c.queue = slices.Delete(c.queue, 0, n)
	for _, call := range batch {
		call.claimed = true
	}
	c.appTx = n == 1 && batch[0].kind == transaction
	c.busy = n > 1
	if n > 0 {
		c.stats.Transactions++
		c.stats.Writes += int64(n)
		if n > 1 {
			c.stats.Shared += int64(n)
		}
	}
	return batch
}

// runBatch runs one batch in one transaction and publishes the outcomes.
// The batch is claimed only once the transaction holds the write lock, so
// that callers can withdraw while it waits for another process. A busy
// database retries the whole batch. A call whose own failure ended the
// transaction (as on a full disk) keeps its error, and the others run
// again without it: none is told of a change that was rolled back.
func (c *committer) runBatch() {
	c.db.checkpoints.finish(c.db.wsql)
	var (
		batch   []*txCall // the calls taken off the queue
		run     []*txCall // the calls of the next run
		claimed bool
		culprit *txCall // of the last try, if its own failure ended the transaction
	)
	take := func(calls []*txCall) { batch, run, claimed = calls, calls, true }
	for {
		err := entstore.Retry(context.Background(), writeAttempts, isBusy, func(ctx context.Context) error {
			culprit = nil
			for _, call := range run {
				call.err, call.panicked, call.panicVal = nil, false, nil // of an earlier run
			}
			unlock, err := c.db.writers.lock()
			if err != nil {
				return err
			}
			defer unlock()
			if err := c.db.checkFile(); err != nil {
				return err // not busy: not retried
			}
			if !claimed && c.aloneWithOneStatement() {
				take(c.claim())
			}
			if len(run) == 1 && (run[0].kind == entstore.OneStatement || run[0].kind == entstore.Cleanup) {
				call := run[0] // a statement is a transaction by itself
				if call.err = call.ctx.Err(); call.err == nil {
					call.err = runBody(ctx, nil, call)
				}
				if isBusy(call.err) {
					return call.err // another process kept SQLite's lock: retried like a batch
				}
				return nil
			}
			tx, err := c.db.wsql.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if !claimed {
				c.gather()
				take(c.claim())
			}
			culprit, err = c.savepoints.apply(ctx, tx, run)
			return err
		})
		if !claimed {
			take(c.claim()) // nothing began: each call learns why
		}
		if err != nil && culprit != nil && !isBusy(err) {
			run = slices.DeleteFunc(slices.Clone(run), func(c *txCall) bool { return c == culprit })
			if len(run) > 0 {
				continue
			}
		}
		for _, call := range run {
			if err != nil && call.err == nil {
				call.err = err
			}
		}
		break
	}
	// Counted before the callers learn their outcome, so that a caller
	// that writes again finds its last write counted.
	c.db.checkpoints.wrote(batch)
	c.mu.Lock()
	c.appTx = false
	c.mu.Unlock()
	for _, call := range batch {
		close(call.done)
	}
}

// errWritersBusy: another process kept the writer lock past the busy timeout.
var errWritersBusy = errors.New("another process kept the lock store's writer lock for longer than the busy timeout")

// writerQueue queues the write transactions of every process on one
// database file with a flock of "<database>-lock", held from before BEGIN
// to after COMMIT: the kernel wakes a flock waiter at once, where SQLite's
// busy handler sleeps up to 100 ms. SQLite's lock still decides who writes.
// flock cannot time out: a call that gave up leaves it running, for the
// next lock call to take over, or to be let go once granted.
type writerQueue struct {
	f       *os.File // nil where file locks are not available
	timeout time.Duration
	waited  bool // the last turn had to wait (used by the leader alone)

	mu        sync.Mutex
	granted   chan error // outcome of the flock call in flight, or nil
	abandoned bool       // whoever waited for that call gave up
	closed    bool       // the file is closed: its descriptor may be reused
}

// politeDelay is how long a process whose last turn had to wait holds back,
// so that the process the kernel woke is not beaten to the lock again and
// again; holdBack sleeps the thread, where time.Sleep wakes 1 ms late.
const politeDelay = 200 * time.Microsecond

// lock waits for this process's turn, up to the busy timeout, and returns
// the function that ends it.
func (q *writerQueue) lock() (unlock func(), err error) {
	if q.f == nil {
		return func() {}, nil
	}
	if q.waited {
		holdBack(politeDelay)
	}
	q.mu.Lock()
	granted := q.granted
	if granted == nil && tryLockFile(q.f) {
		q.mu.Unlock()
		q.waited = false
		return q.unlock, nil
	}
	q.waited = true
	if granted == nil {
		granted = make(chan error, 1)
		q.granted = granted
		go q.wait(granted)
	}
	q.abandoned = false
	q.mu.Unlock()

	t := time.NewTimer(q.timeout)
	defer t.Stop()
	select {
	case err = <-granted:
	case <-t.C:
		q.mu.Lock()
		select {
		case err = <-granted: // granted as the timer fired
		default:
			q.abandoned = true
			err = errWritersBusy
		}
		q.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	return q.unlock, nil
}

// wait makes the flock call for the waiter, or lets go if it gave up.
func (q *writerQueue) wait(granted chan error) {
	err := lockFile(q.f) // fails once q.f is closed
	q.mu.Lock()
	defer q.mu.Unlock()
	q.granted = nil
	if q.abandoned || q.closed {
		q.abandoned = false
		if err == nil && !q.closed {
			unlockFile(q.f)
		}
		return
	}
	granted <- err
}

func (q *writerQueue) unlock() { unlockFile(q.f) }

// checkFile refuses to write once the store's name no longer names the
// file it opened (ReplacedFileError). A second name does not stop a
// running store: a backup by hard links (cp -al) must not.
func (db *DB) checkFile() error {
	fi, err := os.Stat(db.abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &ReplacedFileError{Path: db.path, Removed: true}
	case err != nil:
		return nil // not this check's to judge: SQLite reports what it meets
	case !os.SameFile(fi, db.file):
		return &ReplacedFileError{Path: db.path}
	}
	return nil
}

// savepoints make each body of a shared transaction atomic on its own.
type savepoints struct {
	begin, release, rollback *sql.Stmt
}

func (sp *savepoints) exec(ctx context.Context, tx *sql.Tx, st *sql.Stmt) error {
	_, err := tx.StmtContext(ctx, st).ExecContext(ctx)
	return err
}

// apply runs the batch's bodies in tx and commits what succeeded; each
// call's outcome is in call.err. It returns an error only when the whole
// transaction failed, with the call that failed it, if one did. In a
// shared transaction a body of several statements runs in a savepoint; a
// failed statement changes nothing, but may mean SQLite ended the
// transaction (full disk, I/O error): it fails it, and the others run again.
func (sp *savepoints) apply(ctx context.Context, tx *sql.Tx, batch []*txCall) (culprit *txCall, err error) {
	committed := false
	defer func() {
		if !committed {
			if rerr := tx.Rollback(); rerr != nil && err != nil && !errors.Is(rerr, sql.ErrTxDone) {
				err = errors.Join(err, rerr)
			}
		}
	}()
	shared := len(batch) > 1
	wrote := false
	for _, call := range batch {
		if err := call.ctx.Err(); err != nil {
			call.err = err
			continue
		}
		savepoint := shared && call.kind == entstore.Statements
		if savepoint {
			if err := sp.exec(ctx, tx, sp.begin); err != nil {
				return nil, err
			}
		}
		call.err = runBody(ctx, tx, call)
		if call.err == nil && call.ctx.Err() != nil && (savepoint || !shared) {
			// The caller gave up while its body ran: its change must not
			// stay. (One statement without a savepoint cannot be undone
			// alone: it stands, and its caller learns that it succeeded.)
			call.err = call.ctx.Err()
		}
		switch {
		case !shared && call.err != nil:
			return nil, nil // rolled back by the deferred call
		case call.err != nil && !savepoint:
			return call, call.err
		case call.err != nil:
			if err := sp.exec(ctx, tx, sp.rollback); err != nil {
				// SQLite ended the transaction itself: nothing stands.
				call.err = errors.Join(call.err, err)
				return call, call.err
			}
			fallthrough
		case savepoint:
			if err := sp.exec(ctx, tx, sp.release); err != nil {
				if call.err == nil {
					call.err = err
				}
				return call, err
			}
		}
		wrote = wrote || call.err == nil
	}
	if !wrote {
		return nil, nil
	}
	committed = true
	return nil, tx.Commit()
}

// runBody runs call's body without its context's cancellation, on which
// the driver would interrupt the connection and roll back the whole
// shared transaction. A panic is kept for the caller's goroutine.
func runBody(ctx context.Context, tx *sql.Tx, call *txCall) (err error) {
	defer func() {
		if p := recover(); p != nil {
			call.panicked, call.panicVal = true, p
			err = errBodyPanicked
		}
	}()
	return call.body(context.WithoutCancel(call.ctx), tx)
}

// inWrite marks the context that Write passes to its function; fnError
// carries that function's error through the queue as it is.
type (
	inWrite struct{}
	fnError struct{ err error }
)

func (e *fnError) Error() string { return e.err.Error() }

// errNestedWrite refuses a write from inside Write's function, which would
// wait for its own transaction.
var errNestedWrite = errors.New("a write of the lock store was called from inside DB.Write's function, " +
	"with its context, and would wait for that function's own transaction: " +
	"take and release locks before or after the Write, and do the transaction's writes through its tx")

// waitedBehindWrite explains a store write that gave up behind Write: it
// may have been called from Write's function with another context.
const waitedBehindWrite = "it waited behind an application transaction (DB.Write, Container.Write) that was still running: " +
	"if this call was made from inside that Write's function, it was waiting for the function's own transaction, " +
	"which cannot commit until the call returns: take and release locks before or after the Write " +
	"(or pass the function's own context, and such a call is refused at once)"

// Write runs fn in a write transaction of its own on the lock store's
// file, committed when fn returns nil. It queues with the store's writes
// and every process's: a transaction on the application's own *sql.DB
// waits in SQLite's busy handler and can starve a lock's renewals.
//
// Every lock operation waits for fn: keep it short. fn may run again when
// the database was busy, must start from nothing, must not call the lock
// store (with fn's context that fails at once; with another it waits until
// that context ends), nor keep tx. fn's context has ctx's values but not
// its cancellation: when ctx ends while fn runs, fn's changes are undone.
//
// Errors: fn's own, as it returned it; the context's when ctx ends before
// the commit (the changes are undone); a *domain.StoreError when the
// transaction fails (StoreBusy, StoreFull, StoreReadOnly for a store
// opened by OpenReadOnly, ...).
func (db *DB) Write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	const op = "application write"
	if db.wsql == nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly,
			Err: errors.New("the lock store was opened read-only (OpenReadOnly)")}
	}
	if ctx.Value(inWrite{}) != nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreInternal, Err: errNestedWrite}
	}
	err := db.commits.run(ctx, transaction, func(ctx context.Context, tx *sql.Tx) error {
		if err := fn(context.WithValue(ctx, inWrite{}, true), tx); err != nil {
			return &fnError{err: err}
		}
		return nil
	})
	var fe *fnError
	if errors.As(err, &fe) {
		return fe.err
	}
	return FormatError(op, err)
}
