package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/cleveragents/locks/adapters/entstore"
)

// maxBatch bounds the writes that share one transaction. A batch holds the
// write lock for all its bodies, a few microseconds each; the bound keeps
// the wait of the callers queued behind it short.
const maxBatch = 64

// gatherRounds bounds how often a leader yields to let callers that are
// ready to run queue their writes before it claims a batch. On two cores
// the callers woken by the last commit need the processor the leader is
// on; without yielding, batches of 32 callers held about 6 writes, with
// it about 12, at a cost of one yield to a lone caller.
const gatherRounds = 8

// committer runs the writes of one DB with group commit: the write calls
// that arrive while a transaction is under way wait, and then share the
// next transaction, and its commit, which is most of a write's cost (the
// BEGIN IMMEDIATE, the WAL frames and the commit record). A lone call
// runs at once in a transaction of its own, with nothing added.
//
// There is no writer goroutine: the caller at the head of the queue leads,
// runs batches until its own call is done, then hands the lead to the next
// caller queued. In a shared transaction each body of several statements
// runs in a savepoint, so that a refusal, a failure or a panic undoes only
// that body's changes; every call of a batch returns after its COMMIT, so
// that no caller is told of a token that is not committed.
type committer struct {
	db         *DB
	savepoints *savepoints

	mu      sync.Mutex
	queue   []*txCall // calls not yet taken into a batch, in arrival order
	leading bool      // a caller is running batches
	// appTx is set while the batch under way is an application's
	// transaction (Write): a write whose context ends while it waits
	// behind one says so (see await).
	appTx bool
	stats WriteStats
}

// WriteStats counts the writes of a DB since it opened.
type WriteStats struct {
	// Transactions is how many transactions the writes ran in (a write
	// of one statement that ran alone counts as one).
	Transactions int64
	// Writes is how many writes ran: Writes/Transactions is the average
	// batch.
	Writes int64
	// Shared is how many writes shared their transaction with others.
	Shared int64
}

// WriteStats returns the counts of db's writes so far.
func (db *DB) WriteStats() WriteStats {
	db.commits.mu.Lock()
	defer db.commits.mu.Unlock()
	return db.commits.stats
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

	done chan struct{} // closed when the outcome is final
	lead chan struct{} // closed when the caller is to lead

	claimed bool // taken into a batch (under committer.mu)
	leads   bool // lead was closed (under committer.mu)
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

// await waits until call is done, or its caller is to lead (true). A
// caller whose context ends while its call is still queued withdraws it;
// once the call is in a batch, it waits for the batch's outcome, since
// its change may already be part of the transaction.
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
	for i, q := range c.queue {
		if q == call {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			break
		}
	}
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

// leadUntilDone runs batches until call's own is done, then hands the lead
// on. call is queued, so one of the batches takes it.
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

// passLead makes the caller at the head of the queue the leader, or
// records that nobody leads. c.mu must be held.
func (c *committer) passLead() {
	if len(c.queue) == 0 {
		c.leading = false
		return
	}
	head := c.queue[0]
	head.leads = true
	close(head.lead)
}

// aloneWithOneStatement reports whether the next batch is a single call
// of one statement: the only call queued, or a purge's write, which runs
// alone (see claim).
func (c *committer) aloneWithOneStatement() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return false
	}
	kind := c.queue[0].kind
	return kind == entstore.Cleanup || len(c.queue) == 1 && kind == entstore.OneStatement
}

// gather lets the callers that are ready to run queue their writes before
// the batch is claimed, for as long as more keep coming.
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

// claim takes the next batch off the queue: the calls at its head, up to
// maxBatch, but never a purge's write (entstore.Cleanup), nor an
// application's transaction (Write), with others. A
// purge's statement holds the write lock for a millisecond or more, far
// longer than an acquire or a release, and every call of a batch waits
// for the batch's commit: in the same batch as the writes queued ahead
// of it, it would make them wait for a statement that came after them.
func (c *committer) claim() []*txCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.queue), maxBatch)
	if n > 0 && runsAlone(c.queue[0].kind) {
		n = 1
	}
	for i := 1; i < n; i++ {
		if runsAlone(c.queue[i].kind) {
			n = i
			break
		}
	}
	batch := make([]*txCall, n)
	copy(batch, c.queue)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	for _, call := range batch {
		call.claimed = true
	}
	c.appTx = n == 1 && batch[0].kind == transaction
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
// The batch is claimed only once the transaction has begun (and so holds
// the write lock), so that callers can withdraw while it waits for
// another process.
//
// Every run of the batch starts from nothing: each call's outcome is
// cleared and its body decided again. A busy database is retried as a
// whole batch, like a single write. A call whose own failure ended the
// transaction (its statement failed, and SQLite may have rolled back
// everything with it, as on a full disk) keeps its error, and the others
// run again without it, in a new transaction: none of them fails for
// another's reason, and none is told of a change that was rolled back.
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
				// A statement is a transaction by itself.
				call := run[0]
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
			run = without(run, culprit)
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

// without returns calls without call, in a new slice.
func without(calls []*txCall, call *txCall) []*txCall {
	out := make([]*txCall, 0, len(calls))
	for _, c := range calls {
		if c != call {
			out = append(out, c)
		}
	}
	return out
}

// savepoints are the statements that make each body of a shared
// transaction atomic on its own, prepared once on the writing connection.
type savepoints struct {
	begin, release, rollback *sql.Stmt
}

func prepareSavepoints(ctx context.Context, db *sql.DB) (*savepoints, error) {
	var sp savepoints
	var err error
	for _, p := range []struct {
		st    **sql.Stmt
		query string
	}{{&sp.begin, "SAVEPOINT write"}, {&sp.release, "RELEASE write"}, {&sp.rollback, "ROLLBACK TO write"}} {
		if *p.st, err = db.PrepareContext(ctx, p.query); err != nil {
			sp.close()
			return nil, err
		}
	}
	return &sp, nil
}

func (sp *savepoints) close() {
	for _, st := range []*sql.Stmt{sp.begin, sp.release, sp.rollback} {
		if st != nil {
			st.Close()
		}
	}
}

// exec runs one of the savepoint statements in tx.
func (sp *savepoints) exec(ctx context.Context, tx *sql.Tx, st *sql.Stmt) error {
	_, err := tx.StmtContext(ctx, st).ExecContext(ctx)
	return err
}

// apply runs the batch's bodies in tx and commits what succeeded. It
// returns an error only when the transaction as a whole failed; each
// call's own outcome is in call.err. When the transaction failed because
// of one call (its body or its savepoint), apply returns that call too.
//
// When the batch has several bodies, each body of several statements runs
// in a savepoint, so that a refusal or a failure undoes only its own
// changes. A body of one statement needs none: a statement that fails
// changes nothing. But a failing statement can also mean that SQLite
// ended the transaction (a full disk, an I/O error), after which nothing
// of the batch stands, so it fails the transaction, and the caller runs
// the others again without it.
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
			// The caller gave up while its body ran: it will be told so,
			// so its change must not stay. (A statement run without a
			// savepoint cannot be undone alone; it stands, and its caller
			// learns that it succeeded.)
			call.err = call.ctx.Err()
		}
		switch {
		case !shared && call.err != nil:
			return nil, nil // rolled back by the deferred call
		case call.err != nil && !savepoint:
			return call, call.err
		case call.err != nil:
			if err := sp.exec(ctx, tx, sp.rollback); err != nil {
				// SQLite ended the transaction itself: nothing of the
				// batch stands.
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

// runBody runs call's body with its context's values but not its
// cancellation: the driver answers a cancelled context by interrupting the
// connection, which would roll back the whole shared transaction. A panic
// is kept for the caller, whose goroutine panics again.
func runBody(ctx context.Context, tx *sql.Tx, call *txCall) (err error) {
	defer func() {
		if p := recover(); p != nil {
			call.panicked, call.panicVal = true, p
			err = errBodyPanicked
		}
	}()
	return call.body(context.WithoutCancel(call.ctx), tx)
}
