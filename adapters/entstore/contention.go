package entstore

import (
	"sync"

	"github.com/cleveragents/locks/domain"
)

// maxContended bounds the memory of contention: past it, the hint starts
// over, which costs at most one write-locked refusal per resource.
const maxContended = 4096

// contention remembers the resources whose last acquire or renew in this
// process was refused because another owner held them. It is only a hint
// for where a plain read is likely to save a write; it never decides.
type contention struct {
	mu   sync.Mutex
	refs map[domain.ResourceRef]struct{}
}

func (c *contention) has(ref domain.ResourceRef) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.refs[ref]
	return ok
}

// note records whether the resource was just refused.
func (c *contention) note(ref domain.ResourceRef, refused bool) {
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
