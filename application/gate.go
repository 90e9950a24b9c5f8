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
	closed   bool
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
	if g.closed && g.inFlight == 0 {
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
		if g.inFlight == 0 {
			close(g.idle)
		}
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		n := g.inFlight
		g.mu.Unlock()
		return fmt.Errorf("closing the lock service: %d calls were still in flight when waiting for them ended (%w); "+
			"locks they take stay held until they expire", n, ctx.Err())
	}
}
