package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Every command has a deadline: no connection or statement may wait
// forever on a server that accepted the connection and went silent (a
// firewall that drops packets, a hung proxy). --deadline bounds what a
// command does with the store; it is not --timeout, which bounds a wait
// for a lock that another owner holds: a wait, and the command that
// "locks run" runs, are not bounded by it, but every statement before,
// during (waitRounds) and after them (boundAfter) is.

// defaultDeadline is the bound when neither --deadline nor AGENTS_TIMEOUT
// sets one: long enough for a slow server, short enough for a script.
const defaultDeadline = 30 * time.Second

// registerDeadline adds --deadline to the flags of agents itself.
func (g *globals) registerDeadline(fs *pflag.FlagSet) {
	fs.Func("deadline", "how long a command may wait for the database to answer: a duration `D` or whole seconds "+
		"(env AGENTS_TIMEOUT; default 30s); a --wait is not bounded by it",
		func(s string) (err error) { g.deadline, err = parseDeadline(s); return err })
}

// parseDeadline reads a deadline: a positive duration or whole seconds.
func parseDeadline(s string) (time.Duration, error) {
	d, err := parseDuration(s)
	switch {
	case err != nil:
	case d < 0 && !strings.HasPrefix(strings.TrimSpace(s), "-"):
		// Whole seconds past what a duration holds (parseDuration's -1).
		err = fmt.Errorf("%s seconds is longer than the longest deadline, %d seconds", s, int64(math.MaxInt64/int64(time.Second)))
	case d <= 0:
		err = errors.New("the deadline must be positive")
	}
	return d, err
}

// deadline is the bound of the store's work: --deadline, AGENTS_TIMEOUT or
// the default.
func (c *invocation) deadline() (time.Duration, error) {
	if c.g.deadline > 0 {
		return c.g.deadline, nil
	}
	if s := c.env("AGENTS_TIMEOUT"); s != "" {
		d, err := parseDeadline(s)
		if err != nil {
			return 0, usagef("AGENTS_TIMEOUT=%q: %v", s, err)
		}
		return d, nil
	}
	return defaultDeadline, nil
}

// bound returns ctx ended at the deadline, and remembers it, so that
// finish can tell the deadline from another end.
func (c *invocation) bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	d, err := c.deadline()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, d, errDeadline)
	c.bounded = append(c.bounded, ctx)
	return ctx, cancel, nil
}

// errDeadline is the cause of a context that the deadline ended.
var errDeadline = errors.New("the deadline passed")

// deadlineError reports a command that the deadline ended: a
// *domain.StoreError of kind StoreUnreachable, which names the server,
// what was waited for, and what to check.
func (c *invocation) deadlineError(err error) error {
	hit := false
	for _, ctx := range c.bounded {
		hit = hit || errors.Is(context.Cause(ctx), errDeadline)
	}
	if !hit || err == nil || errors.Is(err, errUsage) {
		return err
	}
	d, _ := c.deadline()
	db, _, _ := c.database()
	check := "check that the server is up, reachable from this host (no firewall or proxy that drops packets) and not overloaded"
	if !locks.IsPostgres(db) {
		check = "the file stayed busy or its file system did not answer: check that no other process holds its write lock for long"
	}
	return &domain.StoreError{Op: fmt.Sprintf("database %s: no answer within %s", db, d), Kind: domain.StoreUnreachable,
		Advice: fmt.Sprintf("%s waited that long to connect to it or for a statement to finish; %s, or set a longer --deadline (or AGENTS_TIMEOUT)",
			c.prog(), check),
		Err: withoutAdvice{err}}
}

// withoutAdvice is an error that the deadline ended, told without the
// advice of the store errors in its chain: that advice is for a failure of
// its own ("check the host, port, database name, user and password", for
// a connection that the deadline cut short), and the deadline's advice
// says what to do. errors.Is and errors.As see the chain as it is.
type withoutAdvice struct{ err error }

func (e withoutAdvice) Error() string {
	msg := e.err.Error()
	for cur := e.err; cur != nil; cur = errors.Unwrap(cur) {
		if se, ok := cur.(*domain.StoreError); ok {
			bare := se.Op
			if se.Err != nil {
				bare += ": " + se.Err.Error()
			}
			msg = strings.Replace(msg, se.Error(), bare, 1)
		}
	}
	return msg
}

func (e withoutAdvice) Unwrap() error { return e.err }

// waits reports whether the command waits for as long as it takes: run,
// while its command runs, and acquire --wait. Their deadline bounds
// opening the store (see open), each round of the wait (waitRounds) and
// each call after the command (lockRun), not the whole command.
func (c *invocation) waits() bool {
	return c.cmd.name == "locks run" || (c.cmd.name == "locks acquire" && c.wait.wait)
}

// runBounded runs cmd within the deadline, unless it waits.
func (c *invocation) runBounded(ctx context.Context, cmd *command, args []string) error {
	if c.waits() {
		return cmd.run(c, ctx, args)
	}
	ctx, cancel, err := c.bound(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	return cmd.run(c, ctx, args)
}

// waitRounds takes a lock with take (AcquireWait or Take) so that no
// statement of it waits forever on a silent server. Without --wait, take
// is bounded by the deadline. A wait runs in rounds: each waits at most
// the deadline (or what is left of --timeout) on the service's clock, and
// its context ends one deadline after that, which bounds the statement in
// flight when the round ends; a wait without --timeout runs as many
// rounds as it takes. A round ended by its context ends the command with
// the deadline's error.
func waitRounds[T any](c *invocation, ctx context.Context, opts application.AcquireOptions, take func(context.Context, application.AcquireOptions) (T, error)) (T, error) {
	var zero T
	d, err := c.deadline()
	if err != nil {
		return zero, err
	}
	if !opts.Wait {
		ctx, cancel, err := c.bound(ctx)
		if err != nil {
			return zero, err
		}
		defer cancel()
		return take(ctx, opts)
	}
	start := c.clock.Now()
	for {
		round := opts
		round.Timeout = d
		if opts.Timeout > 0 {
			round.Timeout = min(d, opts.Timeout-c.clock.Now().Sub(start))
		}
		rctx, cancel := context.WithTimeoutCause(ctx, round.Timeout+d, errDeadline)
		c.bounded = append(c.bounded, rctx)
		v, err := take(rctx, round)
		hit := errors.Is(context.Cause(rctx), errDeadline)
		cancel()
		var conflict *domain.LockConflictError
		switch {
		case !errors.As(err, &conflict):
			return v, err
		case hit:
			// The deadline ended the round, not its wait: a statement got
			// no answer in time. That is the error, not the lock's holder
			// as the wait last saw it.
			if conflict.Cause != nil && !errors.Is(conflict.Cause, context.DeadlineExceeded) {
				return zero, conflict.Cause
			}
			return zero, context.Cause(rctx)
		}
		conflict.Waited = c.clock.Now().Sub(start) // the whole wait's, not the round's
		if !errors.Is(err, context.DeadlineExceeded) || (opts.Timeout > 0 && conflict.Waited >= opts.Timeout) {
			return v, err
		}
		// The round ended with the lock still held: wait on.
	}
}

// boundAfter returns a context for a call that must be made whatever
// happened to ctx (the release after run's command), ended by the
// deadline.
func (c *invocation) boundAfter(ctx context.Context) (context.Context, context.CancelFunc) {
	d, _ := c.deadline() // checked when the store was opened
	ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), d, errDeadline)
	c.bounded = append(c.bounded, ctx)
	return ctx, cancel
}
