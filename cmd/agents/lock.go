package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// What the lock commands share: how a lock is shown, the resource and
// owner they act on, and --ttl.

// lockDoc is a lock in JSON output.
type lockDoc struct {
	Token        int64  `json:"token"`
	OwnerID      string `json:"owner_id"`
	ResourceType string `json:"resource_type"`
	ResourceID   string `json:"resource_id"`
	AcquiredAt   string `json:"acquired_at"`
	ExpiresAt    string `json:"expires_at"`
}

func newLockDoc(l domain.Lock) lockDoc {
	return lockDoc{
		Token:        l.Token,
		OwnerID:      l.Owner,
		ResourceType: string(l.Resource.Type),
		ResourceID:   l.Resource.ID,
		AcquiredAt:   l.AcquiredAt.UTC().Format(jsonTime),
		ExpiresAt:    l.ExpiresAt.UTC().Format(jsonTime),
	}
}

// emitLock writes the lock that a command has just taken or extended:
// "Acquired plan/p1 for owner "alice" (token 7).", then its times.
func (c *invocation) emitLock(verb string, l domain.Lock, now time.Time) error {
	return c.emit(newLockDoc(l), func(w io.Writer) {
		fmt.Fprintf(w, "%s %s for owner %q (token %d).\n", verb, printable(l.Resource.String()), l.Owner, l.Token)
		c.printTimes(w, l, now)
	})
}

func (c *invocation) printTimes(w io.Writer, l domain.Lock, now time.Time) {
	fmt.Fprintf(w, "  acquired  %s\n  expires   %s\n", c.when(l.AcquiredAt, now), c.when(l.ExpiresAt, now))
}

// printConflict reports on stderr who holds the resource, since when and
// for how long yet.
func (c *invocation) printConflict(e *domain.LockConflictError) {
	h := e.Holder
	fmt.Fprintf(c.stderr, "%s: %s is held by another owner: %q (token %d)\n", c.prog(), printable(h.Resource.String()), h.Owner, h.Token)
	c.printTimes(c.stderr, h, e.Now)
	fmt.Fprintf(c.stderr, "Wait until it is released or expires (%s left), or ask its holder to release it.\n",
		short(h.Remaining(e.Now).Round(time.Second)))
}

// openTarget starts every command that acts for the owner on one resource:
// it parses TYPE and ID with the flags in fs, validates them and the owner
// before anything touches the database, and opens the container. The
// caller closes it.
func (c *invocation) openTarget(ctx context.Context, fs *flag.FlagSet, args []string) (*locks.Container, domain.ResourceRef, string, error) {
	pos, err := c.parse(fs, args, "TYPE", "ID")
	if err != nil {
		return nil, domain.ResourceRef{}, "", err
	}
	ref, err := domain.NewResourceRef(domain.ResourceType(pos[0]), pos[1])
	if err != nil {
		return nil, ref, "", err
	}
	owner, err := c.owner()
	if err != nil {
		return nil, ref, "", err
	}
	ctr, err := c.open(ctx, owner, false)
	return ctr, ref, owner, err
}

// ttlFlag is --ttl: a Go duration ("90s", "5m") or whole seconds ("300"),
// within the TTL policy's bounds. Zero, when it is not given, asks the
// service for its default.
type ttlFlag time.Duration

const ttlUsage = "how long the lock lives: a duration `D` (90s, 5m) or whole seconds (300), from 5s to 1h; default 5m"

func (f *ttlFlag) String() string {
	if f == nil || *f == 0 {
		return ""
	}
	return short(time.Duration(*f))
}

// Set parses and checks a TTL. A TTL out of bounds is refused here, as a
// usage error, rather than by the service after the database is open.
func (f *ttlFlag) Set(s string) error {
	var d time.Duration
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		d = time.Duration(n) * time.Second
		if n > math.MaxInt64/int64(time.Second) || n < 0 {
			d = -1
		}
	} else if d, err = time.ParseDuration(s); err != nil {
		return fmt.Errorf("%q is neither a duration such as 90s or 5m nor whole seconds such as 300", s)
	}
	if err := domain.ValidateTTL(d); err != nil {
		return fmt.Errorf("the TTL must be from %s to %s; omit --ttl for the default %s",
			short(domain.MinLockTTL), short(domain.MaxLockTTL), short(domain.DefaultLockTTL))
	}
	*f = ttlFlag(d)
	return nil
}
