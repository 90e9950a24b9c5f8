package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Main runs the agents command. The tests drive it directly, with their
// own writers, environment and clock; main gives it the process's.
type Main struct {
	// Stdin is the input of the command that "locks run" runs; nil means
	// none (the null device).
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Env reads an environment variable; nil means os.Getenv.
	Env func(string) string
	// Clock is where every instant comes from; nil means the real clock.
	Clock application.Clock
	// Location is the time zone of human output; nil means time.Local.
	Location *time.Location
	// Signals delivers to c the signals that "locks run" forwards to its
	// command, until stop is called; nil means SIGINT and SIGTERM through
	// signal.Notify.
	Signals func(c chan<- os.Signal) (stop func())
}

// Run runs one command line (args without the program name) and returns
// the process's exit code.
func (m *Main) Run(ctx context.Context, args []string) (code int) {
	c := &invocation{stdout: &outputWriter{w: m.Stdout}, stderr: m.Stderr, env: m.Env, clock: m.Clock, loc: m.Location, args: args,
		stdin: m.Stdin, rawStdout: m.Stdout, signals: m.Signals}
	if c.env == nil {
		c.env = os.Getenv
	}
	if c.clock == nil {
		c.clock = clock.New()
	}
	if c.loc == nil {
		c.loc = time.Local
	}
	if c.signals == nil {
		c.signals = notifySignals
	}
	defer func() {
		// A panic is a bug, reported in one line like any failure: a stack
		// trace tells an operator nothing they can act on.
		if r := recover(); r != nil {
			code = c.finish(fmt.Errorf("internal error: %v; this is a bug, please report it", r))
		}
	}()
	return c.finish(c.run(ctx))
}

// invocation is the state of one Run: the global flags and the command.
type invocation struct {
	stdout *outputWriter
	stderr io.Writer
	env    func(string) string
	clock  application.Clock
	loc    *time.Location
	args   []string
	// What "locks run" gives its command: the input, the output as Main
	// has it (an *os.File passes to the command as it is), and the
	// signals to forward.
	stdin     io.Reader
	rawStdout io.Writer
	signals   func(c chan<- os.Signal) (stop func())

	g   globals
	cmd *command      // nil until the command is known
	fs  *flag.FlagSet // the flags being parsed, for -h
	// emitted is set once the command's JSON document is out, so that no
	// second one follows it.
	emitted bool
}

// command is one subcommand of agents.
type command struct {
	name    string // as typed: "locks acquire"
	args    string // synopsis of its arguments
	summary string
	run     func(c *invocation, ctx context.Context, args []string) error
}

// commands are the subcommands of agents, in the order of the help text.
var commands = []command{
	{"locks acquire", "TYPE ID [--ttl D] [--wait [--timeout D]]", "Take the lock on a resource for --owner, or re-enter it if --owner holds it already; with --wait, wait until it is free.", (*invocation).acquire},
	{"locks run", "TYPE ID [--ttl D] [--wait [--timeout D]] [--grace D] -- CMD [ARGS...]", "Take the lock, run CMD while keeping it alive, and release it when CMD ends; exit with CMD's status.", (*invocation).lockRun},
	{"locks renew", "TYPE ID [--ttl D]", "Extend the lock that --owner holds on a resource.", (*invocation).renew},
	{"locks release", "TYPE ID", "Release the lock that --owner holds on a resource.", (*invocation).release},
	{"locks release-all", "", "Release every lock of --owner.", (*invocation).releaseAll},
	{"locks list", "[--type T] [--owner O] [--all]", "List the active locks (with --all, expired ones too).", (*invocation).list},
	{"locks cleanup", "", "Purge the expired locks.", (*invocation).cleanup},
	{"diagnostics", "", "Check the database, its schema and its locks, without changing anything.", (*invocation).diagnostics},
}

func (c *invocation) run(ctx context.Context) error {
	fs := c.flagSet()
	if err := fs.Parse(c.args); err != nil {
		return flagError(err)
	}
	args := fs.Args()
	if len(args) == 0 {
		return usagef("no command given")
	}
	name, n := args[0], 1
	switch name {
	case "help":
		return flag.ErrHelp
	case "locks":
		if len(args) < 2 {
			return usagef("locks needs a subcommand: acquire, run, renew, release, release-all, list or cleanup")
		}
		if isHelp(args[1]) {
			return flag.ErrHelp
		}
		name, n = name+" "+args[1], 2
	}
	for _, cmd := range commands {
		if cmd.name == name {
			c.cmd = &cmd
			return cmd.run(c, ctx, args[n:])
		}
	}
	return usagef("unknown command %q", name)
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// prog names the running command in messages: "agents locks acquire".
func (c *invocation) prog() string {
	if c.cmd == nil {
		return "agents"
	}
	return "agents " + c.cmd.name
}

// finish reports err, if any, and returns the exit code: the human message
// on stderr and, with --json, the error document on stdout. Output that
// could not be written is a failure like any other (exit 1): a script
// that reads the result must not take a lost one for success.
func (c *invocation) finish(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		c.usage(c.stdout)
		err = nil
	}
	var status exitStatus
	if errors.As(err, &status) {
		// The status of the command that "locks run" ran, already reported.
		err = nil
	}
	if err == nil {
		if c.stdout.err == nil {
			return int(status)
		}
		err = c.stdout.err
	}
	exit, code := exitCode(err)
	msg := c.redact(oneLine(err.Error()))
	if db, _, dberr := c.database(); dberr == nil && errors.Is(err, domain.ErrUnavailable) {
		// Say which, when the store did not. Compared redacted: the store
		// quotes a DSN with its password hidden.
		if shown := c.redact(db); !strings.Contains(msg, shown) {
			msg = "database " + shown + ": " + msg
		}
	}
	if errors.Is(err, context.Canceled) {
		msg = "interrupted"
	}
	var conflict *domain.LockConflictError
	if errors.As(err, &conflict) {
		c.printConflict(conflict)
	} else {
		fmt.Fprintf(c.stderr, "%s: %s\n", c.prog(), msg)
	}
	if errors.Is(err, errUsage) {
		fmt.Fprintf(c.stderr, "Run '%s -h' for usage.\n", c.prog())
	}
	// A flag that failed to parse may have stopped --json from being seen.
	if (c.g.json || (errors.Is(err, errUsage) && wantsJSON(c.args))) && !c.emitted {
		doc := errorDoc{Code: code, Message: msg}
		if conflict != nil {
			holder := newLockDoc(conflict.Holder)
			doc.Holder = &holder
			if conflict.Cause != nil {
				waited := conflict.Waited.Round(time.Millisecond).Seconds()
				doc.WaitedSeconds = &waited
			}
		}
		var expired *domain.LockExpiredError
		if errors.As(err, &expired) {
			doc.Reason, doc.ExpiredAt = expiredReason(expired)
		}
		_ = c.writeJSON(map[string]errorDoc{"error": doc})
	}
	return exit
}

// usage writes the help of the command, or of agents.
func (c *invocation) usage(w io.Writer) {
	if c.cmd == nil {
		fmt.Fprint(w, usageText())
		return
	}
	fmt.Fprintf(w, "Usage: %s %s\n\n%s\n\nFlags (global ones may also come before the command):\n", c.prog(), c.cmd.args, c.cmd.summary)
	c.fs.SetOutput(w)
	c.fs.PrintDefaults()
}

func usageText() string {
	var b strings.Builder
	b.WriteString(`Usage: agents [--db PATH] [--json] [--owner ID] COMMAND [ARGS]

Inspect and operate the advisory locks of CleverAgents.

Commands:
`)
	for _, cmd := range commands {
		fmt.Fprintf(&b, "  %s %s\n      %s\n", cmd.name, cmd.args, cmd.summary)
	}
	b.WriteString(`
Global flags (before or after the command):
  --db PATH    the lock database: a file, a file: URI or a postgres:// URL (env
               AGENTS_DB; default $XDG_DATA_HOME/cleveragents/agents.db, or
               ~/.local/share/...)
  --json       print exactly one JSON document on stdout
  --owner ID   the owner to act for (env AGENTS_OWNER)

TYPE is plan or project. D is a duration (90s, 5m) or whole seconds (300),
from 5s to 1h; the default is 5m.

Exit codes: 0 success, 1 failure (diagnostics: a check failed; any command
but acquire and run: --db names no lock database), 2 usage or validation
error, 3 held by another owner, 4 renew: the lock expired or is not held
(locks run: the lock was lost while CMD ran; release of a lock not held
exits 0). locks run otherwise exits with CMD's
status (128+N when signal N killed it), 126 when CMD could not be started
and 127 when it was not found.
Run 'agents COMMAND -h' for the flags of a command.
`)
	return b.String()
}
