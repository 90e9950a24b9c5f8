package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// command is one subcommand of agents.
type command struct {
	name    string // as typed: "locks acquire"
	args    string // synopsis of its arguments
	summary string
	// flags registers the command's own flags: only those that act on it.
	flags func(c *invocation, fs *pflag.FlagSet)
	run   func(c *invocation, ctx context.Context, args []string) error
}

// commands are the subcommands of agents, in the order of the help text.
var commands = []command{
	{"locks acquire", "TYPE ID [--owner ID] [--ttl D] [--wait [--timeout D]] [--note TEXT]", "Take the lock on a resource for --owner, or re-enter it if --owner holds it already; with --wait, wait until it is free.",
		func(c *invocation, fs *pflag.FlagSet) {
			c.g.registerOwner(fs, ownerUsage)
			fs.Var(&c.ttl, "ttl", ttlUsage)
			fs.StringVar(&c.note, "note", "", noteUsage+"; a re-entry keeps the note it has")
			c.wait.register(fs)
			c.registerCreate(fs)
		}, (*invocation).acquire},
	{"locks run", "TYPE ID [--owner ID] [--ttl D] [--wait [--timeout D]] [--note TEXT] [--grace D] [--conflict-exit-code N] [--lost-exit-code N] -- CMD [ARGS...]", "Take the lock, run CMD while keeping it alive, and release it when CMD ends; exit with CMD's status.",
		func(c *invocation, fs *pflag.FlagSet) {
			c.g.registerOwner(fs, ownerUsage+"; default: an id of this agents process")
			fs.Var(&c.ttl, "ttl", ttlUsage+"; renewed every half of it while CMD runs")
			fs.StringVar(&c.note, "note", "", noteUsage)
			c.wait.register(fs)
			c.registerCreate(fs)
			c.grace = defaultGrace
			fs.Func("grace", "how long CMD has to exit after SIGTERM, once the lock is lost, before SIGKILL: a duration `D` or whole seconds; default 10s",
				func(s string) (err error) {
					if c.grace, err = parseDuration(s); err == nil && c.grace < 0 {
						err = errors.New("the grace period must not be negative")
					}
					return err
				})
			c.conflictExit, c.lostExit = exitConflict, exitExpired
			fs.Func("conflict-exit-code", "exit with `N` instead of 3 when another owner holds the lock (or --wait gives up): 0 to 255, but not 1, 2, 126 or 127, which agents uses for other failures",
				func(s string) (err error) { c.conflictExit, err = parseExitCode(s, true); return err })
			fs.Func("lost-exit-code", "exit with `N` instead of 4 when the lock is lost while CMD runs: 3 to 255, but not 126 or 127, which agents uses for other failures, nor --conflict-exit-code",
				func(s string) (err error) { c.lostExit, err = parseExitCode(s, false); return err })
		}, (*invocation).lockRun},
	{"locks renew", "TYPE ID [--owner ID] [--ttl D]", "Extend the lock that --owner holds on a resource.",
		func(c *invocation, fs *pflag.FlagSet) {
			c.g.registerOwner(fs, ownerUsage)
			fs.Var(&c.ttl, "ttl", ttlUsage)
		}, (*invocation).renew},
	{"locks release", "TYPE ID [--owner ID]", "Release the lock that --owner holds on a resource.",
		func(c *invocation, fs *pflag.FlagSet) { c.g.registerOwner(fs, ownerUsage) }, (*invocation).release},
	{"locks release-all", "[--owner ID]", "Release every lock of --owner.",
		func(c *invocation, fs *pflag.FlagSet) { c.g.registerOwner(fs, ownerUsage) }, (*invocation).releaseAll},
	{"locks list", "[--type T] [--owner O] [--all]", "List the active locks (with --all, expired ones too).",
		func(c *invocation, fs *pflag.FlagSet) {
			fs.StringVar(&c.listType, "type", "", "show only the locks on resources of this `type` (plan or project)")
			c.g.registerOwner(fs, "show only the locks of this owner `O` (AGENTS_OWNER does not filter)")
			fs.BoolVar(&c.listAll, "all", false, "show the expired locks that are not purged yet too")
		}, (*invocation).list},
	{"locks cleanup", "", "Purge the expired locks.", nil, (*invocation).cleanup},
	{"diagnostics", "", "Check the database, its schema and its locks, without changing anything.", nil, (*invocation).diagnostics},
}

const ownerUsage = "the owner `ID` to act for (env AGENTS_OWNER)"

// locksSubcommands names the subcommands of "locks", for its usage error.
const locksSubcommands = "acquire, run, renew, release, release-all, list or cleanup"

// rootCommand builds the cobra command tree of one Run. Cobra parses the
// flags (pflag: before, between or after the arguments), refuses unknown
// commands and flags in its own words, and dispatches; the help and the
// exit codes stay agents' own: errors come back from Execute to finish
// (cobra's and pflag's as usage errors, their text unchanged), and the
// help is usage's.
func (c *invocation) rootCommand() *cobra.Command {
	// Args is left nil: cobra then refuses an unknown command itself, with
	// its suggestions ("Did you mean this?").
	root := &cobra.Command{
		Use:                        "agents",
		SilenceErrors:              true,
		SilenceUsage:               true,
		SuggestionsMinimumDistance: 2,
		RunE: func(_ *cobra.Command, _ []string) error {
			c.ran = true
			if c.showVersion {
				return c.version()
			}
			return usagef("no command given")
		},
	}
	// --version is agents' own rather than cobra's, whose template cannot
	// see --json.
	root.Flags().BoolVarP(&c.showVersion, "version", "v", false, "print the version of agents and the revision it was built from")
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetArgs(normalizeArgs(c.args))
	c.g.register(root.PersistentFlags())
	knowSwitches(root)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		c.cmd = c.lookup(cmd)
		return &cobraError{err: err}
	})
	cobraHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		c.cmd = c.lookup(cmd)
		if c.cmd == nil && cmd != root && cmd.Name() != "locks" {
			cobraHelp(cmd, args) // cobra's own commands: completion
			return
		}
		c.usage(c.stdout, cmd)
	})
	locksCmd := &cobra.Command{
		Use:                        "locks",
		Short:                      "Operate the locks",
		SuggestionsMinimumDistance: 2,
		Args:                       unknownSubcommand,
		RunE: func(_ *cobra.Command, _ []string) error {
			c.ran = true
			return usagef("locks needs a subcommand: %s", locksSubcommands)
		},
	}
	knowSwitches(locksCmd)
	root.AddCommand(locksCmd)
	for i := range commands {
		cmd := &commands[i]
		parent, use := root, cmd.name
		if name, ok := strings.CutPrefix(cmd.name, "locks "); ok {
			parent, use = locksCmd, name
		}
		cc := &cobra.Command{
			Use:   use + " " + cmd.args,
			Short: cmd.summary,
			Args:  cobra.ArbitraryArgs,
			RunE: func(cc *cobra.Command, args []string) error {
				c.ran = true
				c.cmd = cmd
				c.dash = cc.ArgsLenAtDash()
				return c.runBounded(cc.Context(), cmd, args)
			},
		}
		if cmd.flags != nil {
			cmd.flags(c, cc.Flags())
		}
		c.completions(cc)
		parent.AddCommand(cc)
	}
	if len(c.args) > 0 && (c.args[0] == cobra.ShellCompRequestCmd || c.args[0] == cobra.ShellCompNoDescRequestCmd) {
		plainUsages(root)
	}
	return root
}

// unknownSubcommand refuses an argument of "locks" as cobra refuses one of
// agents (which it checks itself: the root's Args is nil), with its words
// and suggestions; cobra checks the subcommands of the root only.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	var did strings.Builder
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		did.WriteString("\n\nDid you mean this?\n")
		for _, name := range s {
			fmt.Fprintf(&did, "\t%v\n", name)
		}
	}
	return fmt.Errorf("unknown command %q for %q%s", args[0], cmd.CommandPath(), did.String())
}

// lookup returns the command of agents that cmd is, or nil for agents
// itself and "locks".
func (c *invocation) lookup(cmd *cobra.Command) *command {
	name := strings.TrimPrefix(cmd.CommandPath(), "agents ")
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// knowSwitches makes the switches of the commands (flags that take no
// value) known to cmd, agents itself or "locks", hidden: cobra, looking
// for the command among the arguments, takes any flag that the commands
// on the way do not know for one with a value, and "agents --create --db
// X locks acquire" ran a command "X". The command that cobra finds parses
// them as its own, or refuses those it does not take.
func knowSwitches(cmd *cobra.Command) {
	for _, name := range []string{"all", "create", "wait"} {
		cmd.Flags().Bool(name, false, "")
		_ = cmd.Flags().MarkHidden(name)
	}
}

// valueFlags are the flags that take a value, whose value normalizeArgs
// leaves alone.
var valueFlags = map[string]bool{"db": true, "deadline": true, "owner": true, "ttl": true, "timeout": true, "grace": true, "type": true, "note": true,
	"conflict-exit-code": true, "lost-exit-code": true}

// normalizeArgs spells "-flag" as "--flag", up to "--": agents has always
// taken both, and pflag would read "-db" as the shorthands d and b. "-h"
// stays the shorthand of --help.
func normalizeArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			a = "-" + a
		}
		out = append(out, a)
		if name, ok := strings.CutPrefix(a, "--"); ok && valueFlags[name] && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

// versionDoc is what "agents --version --json" prints: the module's
// version ("(devel)" for a build in a work tree), the VCS revision it was
// built from (null when the toolchain recorded none), whether the work
// tree had changes, and the Go version.
type versionDoc struct {
	Version  string  `json:"version"`
	Revision *string `json:"revision"`
	Modified bool    `json:"modified"`
	Go       string  `json:"go"`
}

// buildVersion reads the version of agents as the Go toolchain recorded it.
func buildVersion() (versionDoc, bool) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return versionDoc{Version: "unknown", Go: runtime.Version()}, false
	}
	v := versionDoc{Version: info.Main.Version, Go: info.GoVersion}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = &s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v, true
}

// version prints the version of agents: one line, or with --json the
// versionDoc. The line names the module version and the VCS revision it
// was built from.
func (c *invocation) version() error {
	v, ok := buildVersion()
	if c.g.json {
		return c.writeJSON(v)
	}
	return c.emit(nil, func(w io.Writer) {
		if !ok {
			fmt.Fprintln(w, "agents (unknown version: built without module information)")
			return
		}
		line := "agents " + v.Version
		if v.Revision != nil {
			line += ", revision " + *v.Revision
			if v.Modified {
				line += " (modified)"
			}
		}
		fmt.Fprintln(w, line+", "+v.Go)
	})
}
