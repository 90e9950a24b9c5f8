package application

import (
	"context"
	"time"

	"github.com/cleveragents/locks/domain"
)

// A holder that hears a wake-up on its resource reads its row: at most
// lookBurst reads at once, then one every lookEvery, however many come.
const (
	lookEvery = 250 * time.Millisecond
	lookBurst = 3
)

// pacer spaces a holder's reads (a generic cell rate: tat, the time at
// which the reads so far would be paid for at one per lookEvery).
type pacer struct{ tat time.Time }

// take returns how long a read must wait at now; zero: read now (counted).
func (p *pacer) take(now time.Time) time.Duration {
	if p.tat.Before(now) {
		p.tat = now
	}
	if early := p.tat.Sub(now) - (lookBurst-1)*lookEvery; early > 0 {
		return early
	}
	p.tat = p.tat.Add(lookEvery)
	return 0
}

// watch watches the handle's resource for news of a removal or a
// takeover elsewhere (nil: none comes; the renewals find it).
func (k *keeper) watch() (news <-chan struct{}, stop func()) {
	if w := k.h.svc.wakeups; w != nil {
		return w.Watch(k.h.Lock().Resource)
	}
	return nil, func() {}
}

// look reads the lock by its token after news, and reports whether it is
// still held; a read that fails proves nothing, and the renewal decides.
// The read is abandoned when renewal falls due (due), or the service
// closes: a store that does not answer must not hold back the renewal and
// the expiry it declares. A loss is an event, as a renewal's would have
// been (renew_failed).
func (k *keeper) look(renewal <-chan time.Time) (stillHeld, due bool) {
	svc, held := k.h.svc, k.h.Lock()
	ctx, cancel := context.WithCancel(k.run)
	finished, fired := make(chan struct{}), make(chan bool, 1)
	go func() {
		select {
		case <-renewal:
			cancel()
			fired <- true
		case <-svc.gate.closing:
			cancel()
			fired <- false
		case <-finished:
			fired <- false
		}
	}()
	_, lost, _ := svc.explainLoss(ctx, held)
	cut := ctx.Err() != nil // released, or abandoned: the read proves nothing
	close(finished)
	due = <-fired
	cancel()
	if lost == nil || cut {
		return true, due
	}
	k.lose(*lost)
	if err := k.h.Err(); err != nil {
		svc.observe(k.run, Event{Kind: EventLost, Owner: held.Owner, Resource: held.Resource, Previous: &held, Err: err})
	}
	return false, due
}

// heard wakes a keep-alive that watches for news.
func (k *keeper) heard() {
	select {
	case k.poke <- struct{}{}:
	default: // a look is already due
	}
}

// poke tells the keep-alive of ref's holding handle, if any, that its lock
// may have been removed or replaced by this service.
func (hs *holders) poke(ref domain.ResourceRef) {
	hs.mu.Lock()
	sl := hs.slots[ref]
	var h *Handle
	if sl != nil {
		h = sl.holder
	}
	hs.mu.Unlock()
	if h != nil {
		h.heard()
	}
}

// pokeAll is poke for every resource, after a release of many.
func (hs *holders) pokeAll() {
	hs.mu.Lock()
	var held []*Handle
	for _, sl := range hs.slots {
		if sl.holder != nil {
			held = append(held, sl.holder)
		}
	}
	hs.mu.Unlock()
	for _, h := range held {
		h.heard()
	}
}

// heard wakes h's keep-alive, if it runs.
func (h *Handle) heard() {
	h.mu.Lock()
	k := h.keeper
	h.mu.Unlock()
	if k != nil { // a root's: a re-entry holds no place
		k.heard()
	}
}
