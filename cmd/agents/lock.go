package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
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
	Note         string `json:"note,omitempty"` // absent for a lock without one
}

func newLockDoc(l domain.Lock) lockDoc {
	return lockDoc{
		Token:        l.Token,
		OwnerID:      l.Owner,
		ResourceType: string(l.Resource.Type),
		ResourceID:   l.Resource.ID,
		AcquiredAt:   l.AcquiredAt.UTC().Format(jsonTime),
		ExpiresAt:    l.ExpiresAt.UTC().Format(jsonTime),
		Note:         l.Note,
	}
}

// emitLock writes the lock that a command has just taken or extended:
// "Acquired plan/p1 for owner "alice" (token 7).", then its times.
func (c *invocation) emitLock(verb string, l domain.Lock, now time.Time) error {
	return c.emit(newLockDoc(l), func(w io.Writer) { c.printLock(w, verb, l, now) })
}

func (c *invocation) printLock(w io.Writer, verb string, l domain.Lock, now time.Time) {
	fmt.Fprintf(w, "%s %s for owner %q (token %d).\n", verb, printable(l.Resource.String()), l.Owner, l.Token)
	c.printTimes(w, l, now)
}

func (c *invocation) printTimes(w io.Writer, l domain.Lock, now time.Time) {
	fmt.Fprintf(w, "  acquired  %s\n  expires   %s\n", c.when(l.AcquiredAt, now), c.when(l.ExpiresAt, now))
	if l.Note != "" {
		fmt.Fprintf(w, "  note      %s\n", printable(l.Note))
	}
}

// printConflict reports on stderr who holds the resource, since when and
// for how long yet.
func (c *invocation) printConflict(e *domain.LockConflictError) {
	h, now := e.Holder, e.Now
	if e.Cause != nil {
		// A wait that gave up: e.Now is its last try, which may be a while
		// ago.
		now = c.clock.Now()
	}
	if e.SameOwner {
		// locks run holds its lock as one acquisition, which never shares
		// it, not even with its own owner's other acquisitions.
		fmt.Fprintf(c.stderr, "%s: %s is held by another acquisition of the same owner %q (token %d)\n",
			c.prog(), printable(h.Resource.String()), h.Owner, h.Token)
	} else {
		fmt.Fprintf(c.stderr, "%s: %s is held by another owner: %q (token %d)\n", c.prog(), printable(h.Resource.String()), h.Owner, h.Token)
	}
	c.printTimes(c.stderr, h, now)
	// A wait is told to the second, or to the millisecond below one.
	waited := e.Waited.Round(time.Second)
	if e.Waited < time.Second {
		waited = e.Waited.Round(time.Millisecond)
	}
	switch {
	case errors.Is(e.Cause, context.DeadlineExceeded):
		fmt.Fprintf(c.stderr, "Gave up after waiting %s (--timeout).\n", short(waited))
	case e.Cause != nil:
		fmt.Fprintf(c.stderr, "Interrupted after waiting %s.\n", short(waited))
	}
	if e.RowHeld {
		// The lock has expired, but a transaction of the holder's (a
		// fenced write) still holds its row: it changes hands when that
		// transaction ends, not at an expiry.
		fmt.Fprintf(c.stderr, "Its lock has expired, but a transaction that holds its row (the holder's fenced write) has not ended: "+
			"wait for it (--wait), or ask its holder to end that transaction.\n")
		return
	}
	fmt.Fprintf(c.stderr, "Wait until it is released or expires (%s left), or ask its holder to release it.\n",
		short(h.Remaining(now).Round(time.Second)))
}

// openTarget starts every command that acts for the owner on one resource:
// it parses TYPE and ID with the flags in fs, validates them and the owner
// before anything touches the database, and opens the container (with
// skipCleanup, without the startup cleanup). The caller closes it.
func (c *invocation) openTarget(ctx context.Context, args []string, skipCleanup bool) (*locks.Container, domain.ResourceRef, string, error) {
	ref, owner, err := c.target(args)
	if err != nil {
		return nil, ref, "", err
	}
	ctr, err := c.open(ctx, owner, skipCleanup, existingOnly)
	return ctr, ref, owner, err
}

// target parses TYPE and ID with the flags in fs, and validates them and
// the owner, without touching the database.
func (c *invocation) target(args []string) (domain.ResourceRef, string, error) {
	pos, err := positional(args, "TYPE", "ID")
	if err != nil {
		return domain.ResourceRef{}, "", err
	}
	ref, err := domain.NewResourceRef(domain.ResourceType(pos[0]), pos[1])
	if err != nil {
		return ref, "", err
	}
	owner, err := c.owner()
	return ref, owner, err
}

// ttlFlag is --ttl: a Go duration ("90s", "5m") or whole seconds ("300"),
// within the TTL policy's bounds. Zero, when it is not given, asks the
// service for its default.
type ttlFlag time.Duration

const noteUsage = "what the lock is taken for, shown by list and diagnostics and to owners it refuses: `TEXT` of at most 256 bytes on one line"

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
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	if err := domain.ValidateTTL(d); err != nil {
		return fmt.Errorf("the TTL must be from %s to %s; omit --ttl for the default %s",
			short(domain.MinLockTTL), short(domain.MaxLockTTL), short(domain.DefaultLockTTL))
	}
	*f = ttlFlag(d)
	return nil
}

// parseDuration parses the durations of the flags: a Go duration ("90s",
// "5m") or whole seconds ("300"). Whole seconds too many to count in a
// duration come back negative, which every flag refuses.
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > math.MaxInt64/int64(time.Second) || n < 0 {
			return -1, nil
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is neither a duration such as 90s or 5m nor whole seconds such as 300", s)
	}
	return d, nil
}

// waitFlags are --wait and --timeout, of the commands that take a lock.
type waitFlags struct {
	wait       bool
	timeout    time.Duration
	timeoutSet bool
}

func (w *waitFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&w.wait, "wait", false, "wait until the lock is free, instead of exiting 3 while another owner holds it")
	fs.Func("timeout", "with --wait: give up after `D` (a duration or whole seconds), exit 3; default: wait as long as it takes",
		func(s string) error {
			d, err := parseDuration(s)
			if err != nil {
				return err
			}
			if d <= 0 {
				return fmt.Errorf("the timeout must be positive; omit --timeout to wait as long as it takes")
			}
			w.timeout, w.timeoutSet = d, true
			return nil
		})
}

// options returns the acquire options that the flags ask for, the note
// checked before the database is opened (or created).
func (w *waitFlags) options(ttl ttlFlag, note string) (application.AcquireOptions, error) {
	if w.timeoutSet && !w.wait {
		return application.AcquireOptions{}, usagef("--timeout bounds a wait: pass --wait with it")
	}
	if err := domain.ValidateNote(note); err != nil {
		return application.AcquireOptions{}, err
	}
	return application.AcquireOptions{TTL: time.Duration(ttl), Wait: w.wait, Timeout: w.timeout, Note: note}, nil
}

// Type names the value of --ttl in help.
func (f *ttlFlag) Type() string { return "D" }
