package postgres

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/cleveragents/locks/domain"
)

// Group commit: a write with nothing of its kind in flight runs alone;
// others queue for the next batch, one statement and one commit. One member
// per resource; no batch waits for a lock, so none deadlocks; a failed
// batch sends each member alone; no member returns before its commit, but
// one that leaves returns at once and its committed acquisition is undone.

// maxBatch bounds the members of one batch: the arrays of one statement.
const maxBatch = 256

// maxDetached bounds the batches every caller left, each holding a pool
// connection, so that reads and lone writes keep some of the pool's 10.
const maxDetached = 2

// batchGroup is what a store's batchers share: detached batches, kicks, and Close's wait.
type batchGroup struct {
	*leftGroup
	mu       sync.Mutex
	detached int
	kicks    []func()
}

func (g *batchGroup) full() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.detached >= maxDetached
}

func (g *batchGroup) tryDetach() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.detached >= maxDetached {
		return false
	}
	g.detached++
	return true
}

// detachedEnded counts out a detached batch and kicks every queue.
func (g *batchGroup) detachedEnded() {
	g.mu.Lock()
	g.detached--
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
	// alone: the batch left it out, and its caller runs its own statement.
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
	// one runs a write alone; many runs a batch and sets each member's res,
	// or alone, or returns the statement's error.
	one  func(ctx context.Context, req Req) (Res, error)
	many func(ctx context.Context, ops []*batchOp[Req, Res]) error
	// undo, when set, undoes res, an acquisition whose caller left; it
	// reports whether the database answered.
	undo func(req Req, res Res) bool

	always bool            // every write through many: see InBatches
	yield  func()          // runtime.Gosched when nil
	life   context.Context // ends at Close, and with it every batch

	mu      sync.Mutex
	queue   []*batchOp[Req, Res]
	alone   int  // writes running alone, as their callers' statements
	flying  bool // a batch holds up the queue
	leading bool // a lone write yields before it runs (do)
	group   *batchGroup
	stats   WriteStats
}

// WriteStats counts the writes of a LockRepository.
type WriteStats struct {
	Statements int64 // one per write run alone, one per batch
	Writes     int64 // Writes/Statements is the average batch
	Shared     int64 // writes that shared their statement and commit
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

func (b *batcher[Req, Res]) runAlone(ctx context.Context, req Req) (Res, error) {
	b.mu.Lock()
	b.countLocked(1)
	b.mu.Unlock()
	return b.runOne(ctx, req)
}

func (b *batcher[Req, Res]) runOne(ctx context.Context, req Req) (Res, error) {
	return runOne(ctx, b.group.leftGroup, req, b.one, b.undo)
}

// do runs req on ref: alone when nothing of its kind is in flight, else in the next batch.
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
	op := &batchOp[Req, Res]{ref: ref, req: req, done: make(chan struct{})}
	b.mu.Lock()
	if b.alone == 0 && !b.flying && !b.leading && len(b.queue) == 0 {
		// Lead: yield once so that the callers woken with this one can queue,
		// and run alone only if none did: two statements for one otherwise.
		b.leading = true
		b.mu.Unlock()
		b.yieldOnce()
		b.mu.Lock()
		b.leading = false
		if len(b.queue) == 0 {
			b.alone++
			b.countLocked(1)
			b.mu.Unlock()
			defer func() {
				b.mu.Lock()
				b.alone--
				b.mu.Unlock()
			}()
			return b.runOne(ctx, req)
		}
		b.queue = slices.Insert(b.queue, 0, op) // first in line: it came first
	} else {
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

func (b *batcher[Req, Res]) writeStats() WriteStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

func (b *batcher[Req, Res]) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// leave takes op out, its caller gone; false: op's outcome came first.
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
		if i := slices.Index(b.queue, op); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		return true
	}
	// A batch every caller left is detached, if the group has room;
	// otherwise it holds its kind's queue until its answer.
	if op.flight.waiting--; op.flight.waiting == 0 && !op.flight.detached && b.group.tryDetach() {
		op.flight.detached = true
		b.flying = false
		b.startLocked()
	}
	return true
}

// startLocked sends the next batch from the queue, unless a batch holds it
// up; b.mu is held. gather yields first so that callers woken together
// leave together (batches held twice as many, docs/performance.md).
func (b *batcher[Req, Res]) startLocked() {
	if b.flying || b.leading || len(b.queue) == 0 || b.group.full() {
		return
	}
	b.flying = true
	go b.gather()
}

// gather yields once, then takes the next batch and sends it.
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

func (b *batcher[Req, Res]) yieldOnce() {
	if b.yield != nil {
		b.yield()
	} else {
		runtime.Gosched()
	}
}

// takeLocked takes the oldest members, one per resource, at most maxBatch.
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

// hand hands out the outcomes, undoes those of members that left, and sends the next batch.
func (b *batcher[Req, Res]) hand(f *flight, batch []*batchOp[Req, Res]) {
	var undo []*batchOp[Req, Res]
	b.mu.Lock()
	decided := 0 // the members whose outcome the statement gave
	for _, op := range batch {
		if !op.alone {
			decided++
		}
	}
	b.countLocked(decided)
	unknown := 0 // the members that left whose outcome no one will know
	for _, op := range batch {
		if op.left && !op.alone && b.undo != nil {
			if op.err == nil {
				undo = append(undo, op)
			} else if !unwritten(op.err) {
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
	}
	for _, op := range undo {
		if !b.undo(op.req, op.res) {
			unknown++
		}
	}
	b.group.ended(unknown)
}

func (b *batcher[Req, Res]) set(always bool, life context.Context, g *batchGroup) {
	b.always, b.life, b.group = always, life, g
}

func (b *batcher[Req, Res]) kick() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startLocked()
}
