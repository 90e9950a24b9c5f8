package main

import (
	"context"
	"fmt"
	"io"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
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
	var seen acquireEvents
	ctr.Locks.SetObserver(&seen)
	// Owner-scoped, as the spec has it: a second acquire by the holder
	// re-enters its lock, which a Take (a handle) would refuse.
	l, err := waitRounds(c, ctx, opts, func(ctx context.Context, opts application.AcquireOptions) (domain.Lock, error) {
		return ctr.Locks.AcquireWait(ctx, owner, ref, opts)
	})
	if err != nil {
		return err
	}
	// Re-entry keeps the first acquisition time, and the token: the
	// service says which it was, whatever the clock showed.
	reentered := seen.last == application.EventReentered
	verb := "Acquired"
	if reentered {
		verb = "Re-entered"
	}
	now := ctr.Locks.Now()
	doc := acquireDoc{lockDoc: newLockDoc(l), Reentered: reentered}
	if seen.dead != nil {
		prev := newLockDoc(*seen.dead)
		doc.TookOverFrom = &prev
	}
	return c.emit(doc, func(w io.Writer) {
		c.printLock(w, verb, l, now)
		if d := seen.dead; d != nil {
			fmt.Fprintf(w, "  took it over from owner %q (token %d), a process of this machine that is gone, before its expiry %s\n",
				d.Owner, d.Token, c.when(d.ExpiresAt, now))
		}
	})
}

// acquireEvents remembers what the service reported of acquire's tries:
// the last one's kind (a re-entry or not) and the holder of a lock taken
// over because its process was gone.
type acquireEvents struct {
	last application.EventKind
	dead *domain.Lock
}

func (t *acquireEvents) Observe(_ context.Context, e application.Event) {
	switch e.Kind {
	case application.EventAcquired, application.EventReentered, application.EventTakenOver, application.EventRefused:
		t.last = e.Kind
	}
	if e.Kind == application.EventTakenOver && e.DeadHolder && e.Previous != nil {
		t.dead = e.Previous
	}
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
