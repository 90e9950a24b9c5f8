package entstore

import (
	"sync"

	"github.com/cleveragents/locks/domain"
)

// maxContended bounds the memory of contention: past it, the hint starts
// over, which costs at most one write-locked refusal per resource.
const maxContended = 4096

// Contention remembers resources: those whose last acquire or renew in
// this process was refused because another owner held them (Store's),
// or any other set an adapter keeps. It is only a hint for where a plain
// read is likely to save a write; it never decides. The zero value is
// empty.
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
