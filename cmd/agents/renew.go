package main

import (
	"context"
	"time"
)

// renew runs "locks renew TYPE ID [--ttl D]": extend the owner's active
// lock to now+TTL. A lock that has expired or that the owner does not hold
// is exit 4 (acquire it again); another owner's active lock is exit 3.
func (c *invocation) renew(ctx context.Context, args []string) error {
	// Without the startup cleanup, which would purge the owner's expired
	// lock first and make "it expired at T" look like "never held".
	ctr, ref, owner, err := c.openTarget(ctx, args, true)
	if err != nil {
		return err
	}
	defer c.close(ctr)
	l, err := ctr.Locks.Renew(ctx, owner, ref, time.Duration(c.ttl))
	if err != nil {
		return err
	}
	return c.emitLock("Renewed", l, ctr.Locks.Now())
}
