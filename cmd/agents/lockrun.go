package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// defaultGrace is how long a command whose lock was lost has, after
// SIGTERM, before it gets SIGKILL.
const defaultGrace = 10 * time.Second

// runDoc is the JSON output of "locks run", written once the command has
// ended.
type runDoc struct {
	// Lock is the lock as last acquired or renewed.
	Lock    lockDoc    `json:"lock"`
	Command commandDoc `json:"command"`
	// Lost says why the lock was lost while the command ran; null when it
	// was held throughout.
	Lost *lostDoc `json:"lost"`
	// Released says whether the lock was released when the command ended:
	// false when it was lost, since it is no longer the owner's to release.
	Released bool `json:"released"`
}

// commandDoc is how the command ended.
type commandDoc struct {
	PID int `json:"pid"`
	// ExitCode is its status as a shell reports it: 128+N when signal N
	// killed it.
	ExitCode int `json:"exit_code"`
	// Signal is the number of the signal that killed it, or null.
	Signal *int `json:"signal"`
}

// lostDoc is a lock lost while the command ran.
type lostDoc struct {
	// Reason is expired, taken_over, removed, store_failing or closed; or
	// keeper_gone when the lock was not lost but the keeper of the
	// command's group died or was stopped, and agents killed the group;
	// or renewal_late when the keeper stopped the group because it heard
	// of no renewal before the expiry, but the lock was renewed.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// At is when agents noticed the loss.
	At string `json:"at"`
	// NewHolder is who holds the resource now, for taken_over.
	NewHolder *lockDoc `json:"new_holder,omitempty"`
}

var lostReasons = map[domain.LostReason]string{
	domain.LostExpired:      "expired",
	domain.LostTakenOver:    "taken_over",
	domain.LostStoreFailing: "store_failing",
	domain.LostClosed:       "closed",
	domain.LostRemoved:      "removed",
}

func newLostDoc(e *domain.LockLostError) *lostDoc {
	doc := &lostDoc{Reason: lostReasons[e.Reason], Message: e.Error(), At: e.At.UTC().Format(jsonTime)}
	if e.NewHolder != nil {
		holder := newLockDoc(*e.NewHolder)
		doc.NewHolder = &holder
	}
	return doc
}

// lockRun runs "locks run TYPE ID [flags] -- CMD [ARGS...]": take the lock
// (waiting for it with --wait), start CMD with the lock in its environment,
// keep the lock alive while CMD runs, release it when CMD ends, and exit
// with CMD's status. If the lock is lost meanwhile, CMD's process group
// gets SIGTERM, then SIGKILL after --grace, and agents exits 4 (or
// --lost-exit-code) without releasing anything: the resource may be another owner's by then.
func (c *invocation) lockRun(ctx context.Context, args []string) error {
	ttl, grace := c.ttl, c.grace
	ref, owner, argv, err := c.runTarget(args)
	if err != nil {
		return err
	}
	opts, err := c.wait.options(ttl, c.note)
	if err != nil {
		return err
	}
	if c.conflictExit == c.lostExit {
		return usagef("--conflict-exit-code and --lost-exit-code must differ: both are %d", c.lostExit)
	}
	// Find CMD before the lock is taken, or the database even opened: a
	// typo must not leave a lock, or a new database, behind.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return commandError(argv[0], err)
	}
	// The group exists before the lock is taken, so that the default
	// owner can name it: the lock is not a dead holder's while any
	// process of the work is alive.
	// Catch the signals to forward before anything is started: one that
	// came earlier only cancels ctx, and that may be seen late.
	sigs := make(chan os.Signal, 8)
	defer c.signals(sigs)()
	g, err := startGroup(c.stdin)
	if errors.Is(err, context.Canceled) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: cannot start the process group of %s: %v", errCannotRun, strconv.Quote(argv[0]), err)
	}
	defer g.close()
	if owner == "" {
		owner = runOwner(g)
	}

	// Every renewal tells the keeper the new expiry: it stops the group
	// should agents stop renewing without dying (see group.lease).
	// The expiry is on the store's clock (the server's time, on
	// PostgreSQL), so what is left of it is read on that clock too, not on
	// this host's: a server whose clock runs ahead would otherwise have
	// the keeper act late.
	var (
		leaseTTL   time.Duration     // the handle's, set before the keep-alive starts
		storeClock application.Clock // the container's, set before the lock is taken
	)
	left := func(l domain.Lock) func() time.Duration {
		return func() time.Duration { return l.ExpiresAt.Sub(storeClock.Now()) }
	}
	ctr, err := c.openObserved(ctx, owner, mayCreate, renewals{ref: ref, lease: func(l domain.Lock) {
		g.lease(left(l), leaseTTL, grace)
	}})
	if err != nil {
		return err
	}
	defer c.close(ctr)
	storeClock = ctr.Clock()
	h, err := waitRounds(c, ctx, opts, func(ctx context.Context, opts application.AcquireOptions) (*application.Handle, error) {
		return ctr.Locks.Take(ctx, owner, ref, opts)
	})
	if errors.Is(err, domain.ErrConflict) {
		return &codedError{error: err, exit: c.conflictExit}
	}
	if err != nil {
		return err
	}
	// From here on, the lock and CMD outlive an interrupt of agents: it is
	// forwarded to CMD, and agents waits for CMD before it releases.
	bg := context.WithoutCancel(ctx)
	if ctx.Err() != nil { // interrupted before CMD started: run nothing (a signal in sigs is forwarded to CMD)
		rctx, cancel := c.boundAfter(bg)
		defer cancel()
		_, _ = c.releaseHandle(rctx, h)
		return ctx.Err()
	}
	l := h.Lock()
	leaseTTL = h.TTL()
	g.lease(left(l), leaseTTL, grace) // before CMD starts
	keep, stopKeep := context.WithCancel(bg)
	defer stopKeep()
	held := h.KeepAlive(keep)

	cmd := c.command(path, argv, l)
	p, err := startChild(cmd, g)
	if err != nil {
		stopKeep()
		rctx, cancel := c.boundAfter(bg)
		defer cancel()
		_, _ = c.releaseHandle(rctx, h)
		return commandError(argv[0], err)
	}
	g.foreground()
	c.supervise(p, h, held, sigs, grace)
	ended := ctr.Locks.Now()
	if p.unguarded != "" {
		g.reap() // before the release: no process of the work outlives the lock
	}
	g.close()
	select {
	case <-g.lapsedc():
		// The keeper stopped the group, and CMD's end, or agents' own
		// notice of the loss, came before agents heard of it: say so, and
		// what is left of the group goes now, before the release.
		if p.lapsed == "" && g.keeperFirst() {
			c.lapsed(p, grace)
		}
		if g.busy() {
			g.reap()
		}
	default:
	}

	// CMD has ended: stop renewing, then release the lock if it is still
	// the owner's.
	stopKeep()
	<-h.Done()
	// The check for a loss and the release share one deadline.
	after, cancelAfter := c.boundAfter(bg)
	defer cancelAfter()
	lost := c.lossAtEnd(after, h, ended)
	if lost != nil && !p.reported {
		fmt.Fprintf(c.stderr, "%s: %s\n", c.prog(), oneLine(lost.Error()))
	}
	doc := runDoc{Lock: newLockDoc(h.Lock()), Command: p.result()}
	if lost == nil {
		var err error
		if doc.Released, err = c.releaseHandle(after, h); errors.As(err, &lost) {
			if lost = lostWhileRunning(lost, ended); lost != nil {
				// Gone between the check and the release, which removed
				// nothing (a handle releases by token): the loss says why.
				fmt.Fprintf(c.stderr, "%s: %s\n", c.prog(), oneLine(lost.Error()))
			} else {
				fmt.Fprintf(c.stderr, "%s: warning: the lock could not be released, and expired at %s, after the command ended: %s\n",
					c.prog(), h.Lock().ExpiresAt.UTC().Format(time.RFC3339), c.redact(oneLine(err.Error())))
			}
		}
	}
	if lost != nil {
		doc.Lost = newLostDoc(lost)
	} else if p.unguarded != "" {
		doc.Lost = &lostDoc{Reason: "keeper_gone", Message: p.unguarded, At: c.clock.Now().UTC().Format(jsonTime)}
	} else if p.lapsed != "" {
		doc.Lost = &lostDoc{Reason: "renewal_late", Message: p.lapsed + "; the lock was still held when the command ended",
			At: c.clock.Now().UTC().Format(jsonTime)}
	}
	if c.g.json {
		if err := c.writeJSON(doc); err != nil {
			return err
		}
	}
	if lost != nil || p.unguarded != "" || p.lapsed != "" {
		return exitStatus(c.lostExit)
	}
	return exitStatus(doc.Command.ExitCode)
}

// runTarget parses "TYPE ID [flags] -- CMD [ARGS...]": flags may come
// before, between or after TYPE and ID, as for the other lock commands;
// the first "--" after them starts CMD, whose arguments are never read as
// flags. An ID that begins with a dash follows a "--" of its own:
// "locks run plan -- -p1 -- CMD".
//
// args are the arguments that the flags left, in order; c.dash is how many
// of them came before the first "--" (-1 when there was none).
func (c *invocation) runTarget(args []string) (domain.ResourceRef, string, []string, error) {
	const synopsis = "expected TYPE and ID, then -- and the command to run: agents locks run plan p1 -- make deploy"
	if c.dash < 0 {
		return domain.ResourceRef{}, "", nil, usagef("%s", synopsis)
	}
	pos, argv := args[:c.dash], args[c.dash:]
	if need := 2 - len(pos); need > 0 {
		if len(argv) < need+1 || argv[need] != "--" {
			return domain.ResourceRef{}, "", nil, usagef("%s", synopsis)
		}
		pos, argv = append(pos, argv[:need]...), argv[need+1:]
	}
	if len(pos) != 2 || len(argv) == 0 {
		return domain.ResourceRef{}, "", nil, usagef("%s", synopsis)
	}
	ref, err := domain.NewResourceRef(domain.ResourceType(pos[0]), pos[1])
	if err != nil {
		return ref, "", nil, err
	}
	owner := "" // this process and its command's group (runOwner), unless told otherwise
	if c.g.ownerSet || c.env("AGENTS_OWNER") != "" {
		if owner, err = c.owner(); err != nil {
			return ref, "", nil, err
		}
	}
	return ref, owner, argv, nil
}

// runOwner returns the default owner of "locks run": this process, and the
// process group g in which its command will run.
func runOwner(g *group) string {
	owner := locks.DefaultOwner()
	if p, ok := domain.ParseProcessOwner(owner); ok && g.id() > 0 {
		p.Group = g.id()
		owner = p.String()
	}
	return owner
}

// commandError explains why CMD could not be found or started.
func commandError(name string, err error) error {
	if e := (*exec.Error)(nil); errors.As(err, &e) {
		err = e.Err // without the name, which the message gives once
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s: %v; check its name and PATH", errNotFound, strconv.Quote(name), err)
	}
	return fmt.Errorf("%w: %s: %v", errCannotRun, strconv.Quote(name), err)
}

// command builds CMD, with the lock in its environment. With --json, its
// stdout goes to agents' stderr, so that stdout carries only the one JSON
// document.
func (c *invocation) command(path string, argv []string, l domain.Lock) *exec.Cmd {
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = append(os.Environ(),
		"AGENTS_LOCK_TOKEN="+strconv.FormatInt(l.Token, 10),
		"AGENTS_LOCK_OWNER="+l.Owner,
		"AGENTS_LOCK_RESOURCE="+string(l.Resource.Type)+"/"+l.Resource.ID,
	)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.stdin, c.rawStdout, c.stderr
	if c.g.json {
		cmd.Stdout = c.stderr
	}
	// Output that is not a file is copied by agents; a grandchild of CMD
	// that keeps the pipe open must not hold agents up for long.
	cmd.WaitDelay = time.Second
	return cmd
}

// supervise waits for CMD to end, forwarding the signals that agents
// receives to CMD's process group, and stopping the group if the lock is
// lost: SIGTERM at once, SIGKILL after grace. If the group's keeper dies
// or is stopped, nothing would stop the group should agents die too, so
// the group is killed at once (the keeper with it, if it was stopped).
//
// Once the lock is lost, or a signal has been forwarded, CMD's end is not
// the work's: supervise returns only once every other process of the
// group (but the keeper) is gone too, SIGKILLing what is left grace after
// the SIGTERM (or after CMD's end, for a forwarded signal). After a plain
// exit of CMD, the processes it left behind run on, as in a shell.
func (c *invocation) supervise(p *child, h *application.Handle, held context.Context, sigs <-chan os.Signal, grace time.Duration) {
	lostc := held.Done()
	guard, why := p.group.guarded()
	lapsed := p.group.lapsedc()
	// terminated is set once the group has had its SIGTERM, from agents
	// or from the keeper: it gets no second one.
	terminated := false
	var kill <-chan time.Time
	done := p.done
	// drain is set once CMD's leftovers must be waited for; poll ticks
	// while they are.
	drain, killed := false, false
	var poll <-chan time.Time
	for {
		select {
		case <-done:
			done = nil
			if !drain || !p.group.busy() {
				return
			}
			if kill == nil && !killed {
				fmt.Fprintf(c.stderr, "%s: the command (pid %d) has ended, but processes of its group still run: SIGKILL in %s if they still do\n",
					c.prog(), p.cmd.Process.Pid, short(grace))
				kill = c.after(grace)
			}
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			poll = t.C
		case <-poll:
			if !p.group.busy() {
				return
			}
			if killed {
				p.group.killMembers() // any forked since
			}
		case <-guard:
			guard = nil
			if p.killedGroup && why() == "was killed by SIGKILL" {
				// By agents' own SIGKILL to the group (below), which
				// reached every process of the work at once: no guard
				// was lost behind agents' back, and that message went
				// out already.
				break
			}
			p.unguarded = fmt.Sprintf("the keeper of the command's process group (pid %d) %s: nothing would stop "+
				"the command's processes were agents to die, so agents killed the group (SIGKILL)", p.group.id(), why())
			p.reported = true
			fmt.Fprintf(c.stderr, "%s: %s; run the command again\n", c.prog(), p.unguarded)
			_ = p.kill()
		case s := <-sigs:
			drain = true
			_ = p.signal(s) // fails only once the group has ended
		case <-lapsed:
			lapsed = nil
			drain = true
			if !p.group.keeperFirst() {
				break // agents had stopped the group itself: the keeper only did the same
			}
			c.lapsed(p, grace)
			if !terminated {
				terminated = true
				kill = c.after(grace) // the keeper's SIGKILL too, should it come first
			}
		case <-lostc:
			lostc = nil
			drain = true
			p.reported = true
			fmt.Fprintf(c.stderr, "%s: %s\n", c.prog(), oneLine(context.Cause(held).Error()))
			if terminated {
				break
			}
			terminated = true
			kill = c.after(grace)
			select {
			case <-lapsed: // agents was stopped: the keeper stopped the group meanwhile
				lapsed = nil
				c.lapsed(p, grace)
			default:
				p.group.mark()
				fmt.Fprintf(c.stderr, "%s: stopping the command (pid %d): SIGTERM now, SIGKILL in %s if it is still running\n",
					c.prog(), p.cmd.Process.Pid, short(grace))
				_ = p.terminate()
			}
		case <-kill:
			kill = nil
			killed = true
			if done != nil {
				fmt.Fprintf(c.stderr, "%s: the command (pid %d) was still running %s after SIGTERM: sending SIGKILL\n",
					c.prog(), p.cmd.Process.Pid, short(grace))
				// To the whole group at once, the keeper too: no process
				// it forks meanwhile escapes a signal to the group.
				p.killedGroup = true
				_ = p.kill()
			} else {
				// Only leftovers: the keeper must live on to guard them
				// until they are gone.
				fmt.Fprintf(c.stderr, "%s: the command (pid %d) has ended, but processes of its group were still running %s after it was signalled: sending them SIGKILL\n",
					c.prog(), p.cmd.Process.Pid, short(grace))
				p.group.killMembers()
			}
		}
	}
}

// lapsed records and reports that the keeper of p's group stopped it,
// having heard of no renewal of the lock before its expiry.
func (c *invocation) lapsed(p *child, grace time.Duration) {
	// The keeper SIGKILLs --grace after its SIGTERM, or sooner: a margin
	// before the lock's expiry when it stopped the group ahead of it.
	kill := fmt.Sprintf("then SIGKILL %s later if it was still running", short(grace))
	switch in := p.group.keeperKillIn(grace); {
	case in <= 0:
		kill = "then SIGKILL at once, the lock being about to expire, if it was still running"
	case in < grace:
		kill = fmt.Sprintf("then SIGKILL %s later if it was still running, a margin before the lock's expiry, sooner than --grace %s",
			short(in.Round(time.Millisecond)), short(grace))
	}
	p.lapsed = fmt.Sprintf("the keeper of the command's process group (pid %d) heard of no renewal of the lock before its expiry "+
		"(agents was stopped or frozen, or too slow to renew it), and stopped the command (pid %d): SIGTERM, %s",
		p.group.id(), p.cmd.Process.Pid, kill)
	fmt.Fprintf(c.stderr, "%s: %s\n", c.prog(), p.lapsed)
}

// renewals passes every renewal of the run's lock on ref to lease.
type renewals struct {
	ref   domain.ResourceRef
	lease func(domain.Lock)
}

func (r renewals) Observe(_ context.Context, e application.Event) {
	if e.Kind == application.EventRenewed && e.Err == nil && e.Resource == r.ref {
		r.lease(e.Lock)
	}
}

// lossAtEnd returns the loss of h's lock, noticed while CMD ran or found
// now that it has ended (application.Handle.Lost): a lock that expired
// meanwhile, whose renewal the keep-alive had not yet attempted (agents was
// stopped, say), is lost too.
//
// A lock that expired only after CMD ended, because its last renewal never
// got an answer (a silent server), was held while CMD ran: CMD's status
// stands, and the release that fails is a warning.
func (c *invocation) lossAtEnd(ctx context.Context, h *application.Handle, ended time.Time) *domain.LockLostError {
	var lost *domain.LockLostError
	if !errors.As(h.Lost(ctx), &lost) {
		return nil
	}
	return lostWhileRunning(lost, ended)
}

// lostWhileRunning returns lost, unless it is an expiry that came after
// CMD ended at ended: CMD then ran under the lock.
func lostWhileRunning(lost *domain.LockLostError, ended time.Time) *domain.LockLostError {
	if lost.Reason == domain.LostExpired && ended.Before(lost.Lock.ExpiresAt) {
		return nil
	}
	return lost
}

// releaseHandle releases h's lock and reports whether it did. A failure leaves
// the lock to expire with its TTL: it is warned about here, and does not
// change the exit status, since CMD's is what the caller waits for.
func (c *invocation) releaseHandle(ctx context.Context, h *application.Handle) (bool, error) {
	released, err := h.Release(ctx)
	if err != nil && !errors.Is(err, domain.ErrExpired) { // a loss is not a failure to release
		fmt.Fprintf(c.stderr, "%s: warning: the lock could not be released, and expires at %s: %s\n",
			c.prog(), h.Lock().ExpiresAt.UTC().Format(time.RFC3339), c.redact(oneLine(err.Error())))
	}
	return released, err
}

// after returns a channel that receives once d has passed on the clock.
func (c *invocation) after(d time.Duration) <-chan time.Time {
	if t, ok := c.clock.(interface {
		After(time.Duration) <-chan time.Time
	}); ok {
		return t.After(d)
	}
	return time.After(d)
}
