package main

import (
	"context"
	"io"
)

// acquire runs "locks acquire TYPE ID [--ttl D] [--wait [--timeout D]]":
// take the lock for the owner, or re-enter it (a new expiry, the same
// token) if the owner holds it already. Another owner's active lock is a
// conflict, exit 3: at once, or with --wait once the wait ends without the
// lock (--timeout, or an interrupt).
func (c *invocation) acquire(ctx context.Context, args []string) error {
	ref, owner, err := c.target(args)
	if err != nil {
		return err
	}
	opts, err := c.wait.options(c.ttl)
	if err != nil {
		return err
	}
	ctr, err := c.open(ctx, owner, false, mayCreate)
	if err != nil {
		return err
	}
	defer c.close(ctr)
	before := ctr.Locks.Now()
	h, err := ctr.Locks.Take(ctx, owner, ref, opts)
	if err != nil {
		return err
	}
	l := h.Lock()
	// Re-entry keeps the first acquisition time, and the token.
	reentered := l.AcquiredAt.Before(before)
	verb := "Acquired"
	if reentered {
		verb = "Re-entered"
	}
	now := ctr.Locks.Now()
	return c.emit(acquireDoc{lockDoc: newLockDoc(l), Reentered: reentered}, func(w io.Writer) {
		c.printLock(w, verb, l, now)
	})
}

// acquireDoc is the JSON output of acquire: the lock, and whether the
// owner held it already (a re-entry: the same token, a new expiry).
type acquireDoc struct {
	lockDoc
	Reentered bool `json:"reentered"`
}
