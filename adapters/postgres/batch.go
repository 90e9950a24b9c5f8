package postgres

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/cleveragents/locks/domain"
)

// Group commit on PostgreSQL, a decorator of the one-statement writes
// (lone) that Options.DisableGroupCommit leaves out. A write that finds
// nothing of its kind in flight runs alone, as its own statement, so that
// a lone caller pays for one statement only. One that arrives while writes of its kind are in
// flight joins a queue, and batches carry the queue, one at a time, each
// in one statement over arrays (unnest): one round trip and one commit
// for all of them, each member decided row by row by the same rule as its
// own statement (batchsql.go). A batch leaves once the goroutines ready
// to run have had their turn (gather), so that callers woken together
// leave together.
//
// What a batch promises its members:
//   - One member per resource. A second write on a resource waits in the
//     queue for a later batch, so that a batch never decides twice on one
//     row.
//   - No member waits for another's resource, and no write waits for
//     another's. A batch takes each resource's advisory lock with
//     pg_try_advisory_xact_lock and each row it changes with FOR UPDATE
//     SKIP LOCKED: a member whose resource is busy (an Update transaction,
//     a fence, a lone statement) is left undecided, and decides alone,
//     waiting as it always did, outside the queue. A batch therefore never
//     waits for a lock, and can never deadlock. A lone statement may wait;
//     the queue does not wait for it (it is not a batch): the writes that
//     arrive meanwhile go out in batches.
//   - One member's failure is its own. A batch whose statement fails for
//     a reason of its rows (a constraint, a deadlock the server chose it
//     for) leaves every member to run its own statement; only a failure of
//     the connection or the server (everyMembers) is told to
//     all members, as each would have met it alone.
//   - No member returns before the commit of its write: the statement
//     runs outside any transaction, and its answer comes after its commit.
//   - A member whose context ends returns at once with the context's
//     error, as a caller of its own statement does. Still queued, it is
//     taken out. Already sent, its write may commit: a lock acquired for a
//     caller that left is then released at once by its token (undo), so
//     that nothing holds a resource for a caller that was told it does
//     not; a renewal or a release that commits stands, as it would have
//     alone. A batch that every member has left goes on to its answer, so
//     that its locks can be released, but no longer holds up the queue:
//     the next batch goes out beside it. Closing the store ends it.

// maxBatch bounds the members of one batch: the arrays of one statement.
const maxBatch = 256

// maxDetached bounds the batches of a store, of all kinds, that every
// caller left and that still wait for their answers, each on a connection
// of the pool: a server that has gone silent, or a table that DDL holds
// (LOCK TABLE, CREATE INDEX), holds them all. At the bound, the queues
// wait for them rather than send more, and their callers leave at their
// deadlines, as they would from a lone statement. With one batch of each
// of the five kinds on its way, that is 7 of the pool's 10 connections:
// reads and lone writes keep the others.
const maxDetached = 2

// batchGroup is what the batchers of one store share: how many of their
// batches are detached, and how to send each one's next batch when one
// ends; and the store's count of what Close waits for, which includes the
// batches on their way until the acquisitions of their members that left
// are undone.
type batchGroup struct {
	*leftGroup
	mu       sync.Mutex
	detached int
	kicks    []func()
}

// full says whether the group has as many detached batches as it may.
func (g *batchGroup) full() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.detached >= maxDetached
}

// tryDetach counts one more detached batch, if the bound allows.
func (g *batchGroup) tryDetach() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.detached >= maxDetached {
		return false
	}
	g.detached++
	return true
}

// detachedEnded counts a detached batch out, its answer come.
func (g *batchGroup) detachedEnded() {
	g.mu.Lock()
	g.detached--
	g.mu.Unlock()
}

// kick sends the next batch of every batcher of the group that waits.
func (g *batchGroup) kick() {
	g.mu.Lock()
	kicks := g.kicks
	g.mu.Unlock()
	for _, k := range kicks {
		k()
	}
}

// batchOp is one caller's write in a batcher.
type batchOp[Req, Res any] struct {
	ref  domain.ResourceRef
	req  Req
	done chan struct{} // closed when res, err and alone are set
	res  Res
	err  error
	// alone says that the batch left this member out (its resource was
	// busy, or the batch failed for a reason of its rows): its caller runs
	// its own statement.
	alone bool
	// guarded by the batcher's mu:
	flight *flight // the batch it was sent in; nil while queued
	left   bool    // its caller returned before done
}

// flight is one batch on its way to the server.
type flight struct {
	waiting int // members whose callers still wait
	// detached: every member left, and the queue no longer waits for it.
	detached bool
}

// batcher queues the writes of one kind and sends them in batches.
type batcher[Req, Res any] struct {
	// one runs a single write: the statement a caller runs alone. It
	// returns the database's error as it is.
	one func(ctx context.Context, req Req) (Res, error)
	// many runs a batch of at least two members in one statement and sets
	// each member's res, or its alone. It returns the statement's error,
	// which leaves every member's outcome unset.
	many func(ctx context.Context, ops []*batchOp[Req, Res]) error
	// undo, when set, undoes res, the outcome of a member whose caller
	// left before it came; it reports whether the database answered.
	undo func(req Req, res Res) bool
	// unwritten says whether a write's error shows that it wrote nothing
	// (nil: every failure leaves the outcome unknown).
	unwritten func(error) bool

	// always runs every write through many, alone or not: see InBatches.
	always bool
	// yield is how gather lets the goroutines ready to run go first:
	// runtime.Gosched when nil.
	yield func()

	// life is the store's: it ends at Close, and with it every batch.
	life context.Context

	mu     sync.Mutex
	queue  []*batchOp[Req, Res]
	alone  int  // writes running alone, as their callers' statements
	flying bool // a batch holds up the queue
	// leading: a write that found nothing of its kind in flight yields
	// before it runs alone (do); those that queue meanwhile wait for it.
	leading bool
	group   *batchGroup
	stats   WriteStats
}

// WriteStats counts the writes of a LockRepository.
type WriteStats struct {
	// Statements is how many statements the writes ran in: one per write
	// that ran alone, one per batch.
	Statements int64
	// Writes is how many writes ran: Writes/Statements is the average
	// batch.
	Writes int64
	// Shared is how many writes shared their statement, and its commit,
	// with others.
	Shared int64
}

func (w *WriteStats) add(o WriteStats) {
	w.Statements, w.Writes, w.Shared = w.Statements+o.Statements, w.Writes+o.Writes, w.Shared+o.Shared
}

// countLocked records a statement of n writes. b.mu is held.
func (b *batcher[Req, Res]) countLocked(n int) {
	b.stats.Statements++
	b.stats.Writes += int64(n)
	if n > 1 {
		b.stats.Shared += int64(n)
	}
}

// runAlone runs req alone, as its caller's own statement.
func (b *batcher[Req, Res]) runAlone(ctx context.Context, req Req) (Res, error) {
	b.mu.Lock()
	b.countLocked(1)
	b.mu.Unlock()
	return b.runOne(ctx, req)
}

// runOne runs req as its own statement (see runOne).
func (b *batcher[Req, Res]) runOne(ctx context.Context, req Req) (Res, error) {
	return runOne(ctx, b.group.leftGroup, req, b.one, b.undo)
}

// isUnwritten says whether err, a write's failure, shows that it wrote
// nothing (unwritten).
func (b *batcher[Req, Res]) isUnwritten(err error) bool {
	return b.unwritten != nil && b.unwritten(err)
}

// do runs the write req on ref: at once and alone when nothing of its
// kind is in flight, otherwise in the next batch.
func (b *batcher[Req, Res]) do(ctx context.Context, ref domain.ResourceRef, req Req) (Res, error) {
	if b.always {
		op := &batchOp[Req, Res]{ref: ref, req: req}
		if err := b.many(ctx, []*batchOp[Req, Res]{op}); err != nil {
			var zero Res
			return zero, err
		}
		if op.alone {
			return b.runAlone(ctx, req)
		}
		return op.res, nil
	}
	var op *batchOp[Req, Res]
	b.mu.Lock()
	if b.alone == 0 && !b.flying && !b.leading && len(b.queue) == 0 {
		// Nothing of this kind is in flight: lead. The callers woken with
		// this one (by the answer of a batch of another kind) arrive one
		// after another; yield once so that they can queue, and run alone
		// only if none did. Otherwise the first of them would run alone
		// and the rest in a batch beside it: two statements for one.
		b.leading = true
		b.mu.Unlock()
		b.yieldOnce()
		b.mu.Lock()
		b.leading = false
		if len(b.queue) == 0 {
			b.alone++
			b.countLocked(1)
			b.mu.Unlock()
			defer b.landed()
			return b.runOne(ctx, req)
		}
		op = &batchOp[Req, Res]{ref: ref, req: req, done: make(chan struct{})}
		b.queue = append(b.queue, nil)
		copy(b.queue[1:], b.queue)
		b.queue[0] = op // first in line: it came first
	} else {
		op = &batchOp[Req, Res]{ref: ref, req: req, done: make(chan struct{})}
		b.queue = append(b.queue, op)
	}
	b.startLocked()
	b.mu.Unlock()
	select {
	case <-op.done:
	case <-ctx.Done():
		if b.leave(op) {
			var zero Res
			return zero, ctx.Err()
		}
	}
	if op.alone {
		return b.runAlone(ctx, req)
	}
	return op.res, op.err
}

// landed ends a write that ran alone.
func (b *batcher[Req, Res]) landed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.alone--
}

func (b *batcher[Req, Res]) writeStats() WriteStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// queued returns how many writes wait for a batch.
func (b *batcher[Req, Res]) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// leave takes op out of the batcher, its caller having given up; it
// returns false when op's outcome came first.
func (b *batcher[Req, Res]) leave(op *batchOp[Req, Res]) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-op.done:
		return false
	default:
	}
	op.left = true
	if op.flight == nil {
		for i, q := range b.queue {
			if q == op {
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				break
			}
		}
		return true
	}
	// A batch every caller left is detached, if the group has room: past
	// the bound it holds its kind's queue until its answer, as one that
	// callers still wait for does.
	if op.flight.waiting--; op.flight.waiting == 0 && !op.flight.detached && b.group.tryDetach() {
		op.flight.detached = true
		b.flying = false
		b.startLocked()
	}
	return true
}

// startLocked sends the next batch from the queue, unless a batch holds
// it up. b.mu is held.
//
// The batch is taken from the queue by its own goroutine, after it has
// let the goroutines that are ready to run go first (gather): callers
// woken together, by the answer of a batch of another kind, arrive one
// after another, and the first of them must not leave with a batch of
// its own while the others are about to queue behind it. Without this,
// at 32 callers cycling acquire and release, the batches held half the
// callers that each kind's queue could have (docs/performance.md).
func (b *batcher[Req, Res]) startLocked() {
	if b.flying || b.leading || len(b.queue) == 0 || b.group.full() {
		return
	}
	b.flying = true
	go b.gather()
}

// gather yields once, so that the goroutines ready to run can queue, then
// takes the next batch and sends it. Its callers may all have left
// meanwhile: the queue is then free again.
func (b *batcher[Req, Res]) gather() {
	b.yieldOnce()
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.flying = false
		b.mu.Unlock()
		return
	}
	batch := b.takeLocked()
	f := &flight{waiting: len(batch)}
	for _, op := range batch {
		op.flight = f
	}
	b.group.started()
	b.mu.Unlock()
	b.run(f, batch)
}

// yieldOnce lets the goroutines that are ready to run go first.
func (b *batcher[Req, Res]) yieldOnce() {
	if b.yield != nil {
		b.yield()
	} else {
		runtime.Gosched()
	}
}

// takeLocked takes the next batch from the queue: the oldest members, one
// per resource, at most maxBatch. The others keep their place.
func (b *batcher[Req, Res]) takeLocked() []*batchOp[Req, Res] {
	var (
		batch []*batchOp[Req, Res]
		rest  = b.queue[:0]
		seen  = make(map[domain.ResourceRef]struct{}, min(len(b.queue), maxBatch))
	)
	for _, op := range b.queue {
		if _, dup := seen[op.ref]; dup || len(batch) == maxBatch {
			rest = append(rest, op)
			continue
		}
		seen[op.ref] = struct{}{}
		batch = append(batch, op)
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	return batch
}

// run sends batch and hands each member its outcome. Even a batch of one
// runs the batch statement, which never waits: the queue waits for it.
func (b *batcher[Req, Res]) run(f *flight, batch []*batchOp[Req, Res]) {
	defer b.hand(f, batch)
	if err := b.many(b.life, batch); err != nil {
		if b.life.Err() != nil {
			err = fmt.Errorf("the lock store was closed while the write was on its way: %w", domain.ErrClosed)
		}
		every := everyMembers(err)
		for _, op := range batch {
			var zero Res
			op.res, op.err, op.alone = zero, nil, !every
			if every {
				op.err = err
			}
		}
	}
}

// hand hands the members of batch their outcomes, undoes those of the
// members that left, and sends the next batch.
func (b *batcher[Req, Res]) hand(f *flight, batch []*batchOp[Req, Res]) {
	var undo []*batchOp[Req, Res]
	b.mu.Lock()
	decided := 0 // the members whose outcome the statement gave
	for _, op := range batch {
		if !op.alone {
			decided++
		}
	}
	b.stats.Statements++
	b.stats.Writes += int64(decided)
	if decided > 1 {
		b.stats.Shared += int64(decided)
	}
	unknown := 0 // the members that left whose outcome no one will know
	for _, op := range batch {
		if op.left && !op.alone && b.undo != nil {
			if op.err == nil {
				undo = append(undo, op)
			} else if !b.isUnwritten(op.err) {
				unknown++
			}
		}
		close(op.done)
	}
	if !f.detached {
		b.flying = false
	}
	b.startLocked()
	b.mu.Unlock()
	if f.detached {
		b.group.detachedEnded()
		b.group.kick()
	}
	for _, op := range undo {
		if !b.undo(op.req, op.res) {
			unknown++
		}
	}
	b.group.ended(unknown)
}

// set gives b its store's settings.
func (b *batcher[Req, Res]) set(always bool, life context.Context, g *batchGroup) {
	b.always, b.life, b.group = always, life, g
}

// kick sends the next batch, if one waits.
func (b *batcher[Req, Res]) kick() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startLocked()
}
