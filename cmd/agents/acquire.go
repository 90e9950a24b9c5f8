package main

import (
	"context"
	"time"
)

// acquire runs "locks acquire TYPE ID [--ttl D]": take the lock for the
// owner, or re-enter it (a new expiry, the same token) if the owner holds
// it already. Another owner's active lock is a conflict, exit 3.
func (c *invocation) acquire(ctx context.Context, args []string) error {
	fs := c.flagSet()
	var ttl ttlFlag
	fs.Var(&ttl, "ttl", ttlUsage)
	ctr, ref, owner, err := c.openTarget(ctx, fs, args)
	if err != nil {
		return err
	}
	defer c.close(ctr)
	before := ctr.Locks.Now()
	l, err := ctr.Locks.Acquire(ctx, owner, ref, time.Duration(ttl))
	if err != nil {
		return err
	}
	verb := "Acquired"
	if l.AcquiredAt.Before(before) { // re-entry keeps the first acquisition time
		verb = "Re-entered"
	}
	return c.emitLock(verb, l, ctr.Locks.Now())
}
