package main

import (
	"context"
	"fmt"
	"io"

	"github.com/cleveragents/locks/application"
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
	opts, err := c.wait.options(c.ttl, c.note)
	if err != nil {
		return err
	}
	ctr, err := c.open(ctx, owner, false, mayCreate)
	if err != nil {
		return err
	}
	defer c.close(ctr)
	// Owner-scoped, as the spec has it: a second acquire by the holder
	// re-enters its lock, which a Take (a handle) would refuse.
	r, err := waitRounds(c, ctx, opts, func(ctx context.Context, opts application.AcquireOptions) (application.AcquireResult, error) {
		return ctr.Locks.AcquireWaitResult(ctx, owner, ref, opts)
	})
	if err != nil {
		return err
	}
	// Re-entry keeps the first acquisition time, and the token: the
	// service says which it was, whatever the clock showed.
	l := r.Lock
	verb := "Acquired"
	if r.Reentered {
		verb = "Re-entered"
	}
	now := ctr.Locks.Now()
	doc := acquireDoc{lockDoc: newLockDoc(l), Reentered: r.Reentered}
	if r.TookOverFrom != nil {
		prev := newLockDoc(*r.TookOverFrom)
		doc.TookOverFrom = &prev
	}
	return c.emit(doc, func(w io.Writer) {
		c.printLock(w, verb, l, now)
		if d := r.TookOverFrom; d != nil {
			fmt.Fprintf(w, "  took it over from owner %q (token %d), a process of this machine that is gone, before its expiry %s\n",
				d.Owner, d.Token, c.when(d.ExpiresAt, now))
		}
	})
}

// acquireDoc is the JSON output of acquire: the lock, and whether the
// owner held it already (a re-entry: the same token, a new expiry).
type acquireDoc struct {
	lockDoc
	Reentered bool `json:"reentered"`
	// TookOverFrom is the active lock taken over because its holder, a
	// process of this machine, was gone; absent otherwise.
	TookOverFrom *lockDoc `json:"took_over_from,omitempty"`
}
