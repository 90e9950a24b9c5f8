package application

import (
	"context"
	"fmt"
	"sync"

	"github.com/cleveragents/locks/domain"
)

// gate admits calls until it is closed, and lets Close wait for the calls
// it admitted. Without it, an acquire that is still queued for the store
// when the container shuts down would commit after the release-all, and
// leave a lock that nobody holds blocking its resource for the whole TTL.
type gate struct {
	mu       sync.Mutex
	inFlight int
	// keepers counts the keep-alives running: Close waits for them too,
	// so that every keep-alive context it ends has ended when it returns.
	keepers int
	closed  bool
	// idle is closed when the gate is closed and the last call has left.
	idle chan struct{}
	// closing is closed when the gate closes, so that calls that wait
	// (for a lock, for the next renewal) stop waiting at once.
	closing chan struct{}
}

func newGate() gate { return gate{closing: make(chan struct{})} }

// done is closed once the gate closes.
func (g *gate) done() <-chan struct{} { return g.closing }

// enter admits one call, or returns domain.ErrClosed. Every admitted call
// must call leave.
func (g *gate) enter() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return domain.ErrClosed
	}
	g.inFlight++
	return nil
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	g.idleIfDone()
}

// keep admits one keep-alive, or returns domain.ErrClosed. Every admitted
// keep-alive must call unkeep once it has ended its context.
func (g *gate) keep() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return domain.ErrClosed
	}
	g.keepers++
	return nil
}

func (g *gate) unkeep() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.keepers--
	g.idleIfDone()
}

// idleIfDone closes idle once the gate is closed and nothing is left.
func (g *gate) idleIfDone() {
	if g.closed && g.inFlight == 0 && g.keepers == 0 {
		close(g.idle)
	}
}

// close refuses every later call and waits until the admitted ones have
// left, or ctx ends. Only the first call closes; later ones wait too.
func (g *gate) close(ctx context.Context) error {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.closing)
		g.idle = make(chan struct{})
		g.idleIfDone()
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		n, k := g.inFlight, g.keepers
		g.mu.Unlock()
		return fmt.Errorf("closing the lock service: %d calls were still in flight, and %d keep-alives running, when waiting for them ended (%w); "+
			"locks they take stay held until they expire", n, k, ctx.Err())
	}
}
