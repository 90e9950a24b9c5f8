package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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
	// LocalTime decides expiry on Clock even on PostgreSQL, instead of
	// the server's time: for tests that drive a mock clock.
	LocalTime bool
	// Location is the time zone of human output; nil means time.Local.
	Location *time.Location
	// Signals delivers to c the signals that "locks run" forwards to its
	// command, until stop is called; nil means SIGINT, SIGTERM and SIGHUP
	// through signal.Notify.
	Signals func(c chan<- os.Signal) (stop func())
}

// Run runs one command line (args without the program name) and returns
// the process's exit code.
func (m *Main) Run(ctx context.Context, args []string) (code int) {
	c := &invocation{stdout: &outputWriter{w: m.Stdout}, stderr: m.Stderr, env: m.Env, clock: m.Clock, localTime: m.LocalTime, loc: m.Location, args: args,
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
	// localTime decides expiry on clock even on PostgreSQL (Main.LocalTime).
	localTime bool
	loc       *time.Location
	args      []string
	// What "locks run" gives its command: the input, the output as Main
	// has it (an *os.File passes to the command as it is), and the
	// signals to forward.
	stdin     io.Reader
	rawStdout io.Writer
	signals   func(c chan<- os.Signal) (stop func())

	g   globals
	cmd *command // nil until the command is known
	// dash is how many arguments came before the first "--" ("locks run").
	dash int
	// The flags of the commands that take them.
	ttl      ttlFlag
	wait     waitFlags
	note     string
	grace    time.Duration
	listType string
	listAll  bool
	// The exit codes of "locks run" for a conflict and a lost lock.
	conflictExit, lostExit int
	create                 bool
	// bounded are the contexts that the deadline bounds (deadline.go).
	bounded []context.Context
	// emitted is set once the command's JSON document is out, so that no
	// second one follows it.
	emitted bool
	// ran is set once cobra has handed the command line to a command of
	// agents: an error before that is cobra's own (an unknown command).
	ran         bool
	showVersion bool
}

func (c *invocation) run(ctx context.Context) error {
	err := c.rootCommand().ExecuteContext(ctx)
	if err != nil && !c.ran && !errors.Is(err, errUsage) {
		err = &cobraError{err: err}
	}
	return err
}

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
	if errors.Is(err, pflag.ErrHelp) {
		c.usage(c.stdout, nil)
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
	err = c.deadlineError(err)
	exit, code := exitCode(err)
	if coded := (*codedError)(nil); errors.As(err, &coded) {
		exit = coded.exit
	}
	msg := c.redact(oneLine(err.Error()))
	if ce := (*cobraError)(nil); errors.As(err, &ce) {
		msg = c.redact(cobraLine(err.Error()))
	}
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
		text := msg
		if ce := (*cobraError)(nil); errors.As(err, &ce) {
			// cobra's own message, over its lines as cobra writes it:
			// "Did you mean this?" and its suggestions.
			text = c.redact(strings.TrimRight(err.Error(), "\n"))
		}
		fmt.Fprintf(c.stderr, "%s: %s\n", c.prog(), text)
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
func (c *invocation) usage(w io.Writer, cc *cobra.Command) {
	if c.cmd == nil && cc != nil && cc.Name() == "locks" {
		fmt.Fprint(w, locksUsageText())
		return
	}
	if c.cmd == nil || cc == nil {
		fmt.Fprint(w, usageText())
		return
	}
	fs := pflag.NewFlagSet(c.prog(), pflag.ContinueOnError)
	fs.AddFlagSet(cc.LocalFlags())
	fs.AddFlagSet(cc.InheritedFlags())
	fmt.Fprintf(w, "Usage: %s %s\n\n%s\n\nFlags (--db and --json may also come before the command):\n%s", c.prog(), c.cmd.args, c.cmd.summary,
		fs.FlagUsages())
}

// locksUsageText is the help of "agents locks": its subcommands.
func locksUsageText() string {
	var b strings.Builder
	b.WriteString(`Usage: agents locks COMMAND [ARGS] [FLAGS]

Operate the locks: take, hold, renew, release, list and purge them.

Commands:
`)
	for _, cmd := range commands {
		if name, ok := strings.CutPrefix(cmd.name, "locks "); ok {
			fmt.Fprintf(&b, "  %s\n      %s\n", strings.TrimSpace(name+" "+cmd.args), cmd.summary)
		}
	}
	b.WriteString(`
Run 'agents locks COMMAND -h' for the flags of a command, and 'agents -h'
for the global flags (--db, --json), TYPE, D and the exit codes.
`)
	return b.String()
}

func usageText() string {
	var b strings.Builder
	b.WriteString(`Usage: agents [--db PATH] [--json] COMMAND [ARGS] [FLAGS]

Inspect and operate the advisory locks of CleverAgents.

Commands:
`)
	for _, cmd := range commands {
		fmt.Fprintf(&b, "  %s\n      %s\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.summary)
	}
	b.WriteString(`  completion bash|zsh|fish
      Print the shell completion script for agents.

Global flags (before or after the command):
  --db PATH    the lock database: a file, a file: URI or a postgres:// URL (env
               AGENTS_DB; default $XDG_DATA_HOME/cleveragents/agents.db, or
               ~/.local/share/...)
  --json       print exactly one JSON document on stdout
  --deadline D how long the command may wait for the database to answer (env
               AGENTS_TIMEOUT; default 30s); a --wait is not bounded by it
  --version    print the version of agents and the revision it was built from
               (with --json: as a JSON document)

The commands that act for an owner take --owner ID (env AGENTS_OWNER);
locks list takes it to show only that owner's locks.

TYPE is plan or project. D is a duration (90s, 5m) or whole seconds (300),
from 5s to 1h; the default is 5m.

Exit codes: 0 success, 1 failure (diagnostics: a check failed; --db names
no lock database, and acquire or run was not given --create), 2 usage or validation
error, 3 held by another owner, 4 renew: the lock expired or is not held
(locks run: the lock was lost while CMD ran; release of a lock not held
exits 0). locks run otherwise exits with CMD's status (128+N when signal
N killed it), 126 when CMD could not be started and 127 when it was not
found; its --conflict-exit-code N and --lost-exit-code N replace 3 and 4.
Run 'agents COMMAND -h' for the flags of a command.
`)
	return b.String()
}
