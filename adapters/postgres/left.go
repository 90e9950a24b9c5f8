package postgres

import (
	"context"
	"sync"
	"time"
)

// leftGroup counts a store's writes whose callers left and that go on to
// their answers (outlive), and what Close waits for.
type leftGroup struct {
	mu sync.Mutex
	// left counts the writes whose callers left and that go on to their
	// answers (outlive), within maxLeft. pending counts what Close waits
	// for: those, the writes cut past the bound until their answers come,
	// and the batches on their way until the acquisitions of their members
	// that left are undone. idle, when not nil, is closed when pending
	// comes back to zero. unknown counts the writes whose outcome stayed
	// unknown: an error that does not show that nothing was written, or
	// an undo that got no answer.
	left    int
	pending int
	idle    chan struct{}
	unknown int
}

// maxLeft bounds the writes of a store whose callers left and that go on
// to their answers (outlive), each on a connection of the pool: a
// statement that waits (behind another session's transaction on its
// resource, or on a server that stopped answering) would otherwise hold
// its connection for leftTimeout, and callers that give up and try again
// could take the whole pool from the other calls. Past the bound, a
// caller's statement is cut when it leaves: if it committed all the same,
// its lock lasts until its TTL. With maxDetached batches, that leaves at
// least four of the pool's ten connections to the other calls; under a
// burst of cancellations on a loaded machine, statements outlive their
// callers three and four at a time.
const maxLeft = 4

// tryLeave counts one more write whose caller left and that goes on, if
// the bound allows.
func (g *leftGroup) tryLeave() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left >= maxLeft {
		return false
	}
	g.left++
	g.pending++
	return true
}

// leftEnded counts out such a write, its outcome known or not.
func (g *leftGroup) leftEnded(known bool) {
	g.mu.Lock()
	g.left--
	g.mu.Unlock()
	g.ended(unknownIf(!known))
}

// started counts one more write that Close must wait for: a batch on its
// way, or a write cut past maxLeft until its answer comes.
func (g *leftGroup) started() {
	g.mu.Lock()
	g.pending++
	g.mu.Unlock()
}

// ended counts out a write that Close waited for, unknown of whose
// outcomes stayed unknown.
func (g *leftGroup) ended(unknown int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.unknown += unknown
	if g.pending--; g.pending == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

func unknownIf(b bool) int {
	if b {
		return 1
	}
	return 0
}

// quiet waits, for d at most, until the writes whose callers left and the
// batches on their way have had their answers, and the acquisitions of
// callers that left are undone. It returns how many had not (a batch
// counts once), or ended with their outcome unknown since the group
// began: what a Close that cuts them leaves to their TTLs.
func (g *leftGroup) quiet(d time.Duration) int {
	g.mu.Lock()
	if g.pending > 0 {
		if g.idle == nil {
			g.idle = make(chan struct{})
		}
		idle := g.idle
		g.mu.Unlock()
		t := time.NewTimer(d) // real time: it paces I/O, as leftTimeout does
		select {
		case <-idle:
		case <-t.C:
		}
		t.Stop()
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	return g.pending + g.unknown
}

// outlive runs op on a context that does not end with ctx, whose end
// could cut a statement after the server committed it, unseen. It returns
// op's answer and true if it came before ctx ended. Otherwise it returns
// at once, false, and op goes on, leftTimeout at most, after leaving (if
// set) has run; settle then reads its answer and says whether the outcome
// is known (an acquisition undone, or nothing written). At most maxLeft
// such writes go on at once; past the bound op is cut when its caller
// leaves, and its answer is still settled. Close waits for them all.
func outlive[T any](ctx context.Context, g *leftGroup, op func(context.Context) T, leaving func(), settle func(T) bool) (T, bool) {
	run, cut := context.WithCancel(context.WithoutCancel(ctx))
	answered := make(chan T, 1)
	go func() { answered <- op(run) }()
	select {
	case a := <-answered:
		cut()
		return a, true
	case <-ctx.Done():
	}
	if leaving != nil {
		leaving()
	}
	var zero T
	if !g.tryLeave() {
		cut()
		g.started()
		go func() { g.ended(unknownIf(!settle(<-answered))) }()
		return zero, false
	}
	late := time.AfterFunc(leftTimeout, cut)
	go func() {
		a := <-answered
		late.Stop()
		cut()
		g.leftEnded(settle(a))
	}()
	return zero, false
}

// leftTimeout bounds how long a lone acquire whose caller left goes on to
// learn its outcome (runOne). Past it the statement is cut, as its
// caller's context would have cut it, and a lock it committed all the
// same lasts until its TTL.
const leftTimeout = 10 * time.Second

// runOne runs req as its own statement, one. A write that can be undone
// (an acquire: undo not nil) does not end with its caller's context,
// which could cut the statement after the server committed it, unseen:
// when the caller
// leaves, it returns at once with the context's error, and the statement
// goes on, until its answer or leftTimeout, so that an acquisition it
// made is undone (released by its token and row version), as a batch's
// is; at most maxLeft such statements at once, and Close waits a moment
// for them. Past maxLeft, the statement is cut, and undone only if its
// answer still says that it acquired. Renewals and releases end with
// their callers' contexts: what they commit stands, as in a batch.
func runOne[Req, Res any](ctx context.Context, g *leftGroup, req Req, one func(context.Context, Req) (Res, error), undo func(Req, Res) bool) (Res, error) {
	if undo == nil {
		return one(ctx, req)
	}
	var zero Res
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type answer struct {
		res Res
		err error
	}
	a, ok := outlive(ctx, g, func(run context.Context) answer {
		res, err := one(run, req)
		return answer{res, err}
	}, nil, func(a answer) bool {
		// An error leaves the outcome unknown (a connection cut after
		// the commit, say), unless it shows that nothing was written, and
		// so does an undo the database did not answer.
		if a.err != nil {
			return unwritten(a.err)
		}
		return undo(req, a.res)
	})
	if !ok {
		return zero, ctx.Err()
	}
	return a.res, a.err
}
