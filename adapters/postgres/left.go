package postgres

import (
	"context"
	"sync"
	"time"
)

// leftGroup counts the writes that outlive their callers, for Close.
type leftGroup struct {
	mu      sync.Mutex
	left    int           // writes going on past their callers, within maxLeft
	pending int           // what Close waits for: those, writes cut past the bound, batches on their way
	idle    chan struct{} // closed when pending comes back to zero
	unknown int           // writes whose outcome stayed unknown (an error, an unanswered undo)
}

// maxLeft bounds the writes that outlive their callers, each holding a pool
// connection up to leftTimeout, so that callers that give up and retry
// cannot take the pool; past it the statement is cut.
const maxLeft = 4

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

// started counts one more write that Close waits for.
func (g *leftGroup) started() {
	g.mu.Lock()
	g.pending++
	g.mu.Unlock()
}

// ended counts out a write that Close waited for, unknown outcomes unknown.
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

// quiet waits, d at most, for pending writes: it counts those not ended or unknown.
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

// outlive runs op on a context that ctx's end does not cut (it could cut
// a commit, unseen): op's answer and true if it came before; otherwise
// false at once, after leaving (if set), and op goes on, leftTimeout at
// most (cut past maxLeft); settle says whether its outcome is known.
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
		known := settle(a) // holding its place within maxLeft
		g.mu.Lock()
		g.left--
		g.mu.Unlock()
		g.ended(unknownIf(!known))
	}()
	return zero, false
}

// leftTimeout bounds how long a write outlives its caller.
const leftTimeout = 10 * time.Second

// runOne runs req alone. An acquire (undo not nil) outlives its caller, to
// undo what it made for a caller that left; renewals and releases end
// with their callers' contexts, and what they commit stands.
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
		// An error leaves the outcome unknown unless it shows that
		// nothing was written, and so does an unanswered undo.
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
