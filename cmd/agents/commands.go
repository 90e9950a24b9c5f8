package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
	{"locks acquire", "TYPE ID [--owner ID] [--ttl D] [--wait [--timeout D]]", "Take the lock on a resource for --owner, or re-enter it if --owner holds it already; with --wait, wait until it is free.",
		func(c *invocation, fs *pflag.FlagSet) {
			c.g.registerOwner(fs, ownerUsage)
			fs.Var(&c.ttl, "ttl", ttlUsage)
			c.wait.register(fs)
			c.registerCreate(fs)
		}, (*invocation).acquire},
	{"locks run", "TYPE ID [--owner ID] [--ttl D] [--wait [--timeout D]] [--grace D] -- CMD [ARGS...]", "Take the lock, run CMD while keeping it alive, and release it when CMD ends; exit with CMD's status.",
		func(c *invocation, fs *pflag.FlagSet) {
			c.g.registerOwner(fs, ownerUsage+"; default: an id of this agents process")
			fs.Var(&c.ttl, "ttl", ttlUsage+"; renewed every half of it while CMD runs")
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
// flags (pflag: before, between or after the arguments) and dispatches;
// the messages, the help and the exit codes stay agents' own: errors come
// back from Execute to finish, and the help is usage's.
func (c *invocation) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "agents",
		Version:       version(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("no command given")
			}
			return usagef("unknown command %q", args[0])
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetArgs(normalizeArgs(c.args))
	c.g.register(root.PersistentFlags())
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		c.cmd = c.lookup(cmd)
		return flagError(err)
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
		Use:   "locks",
		Short: "Operate the locks",
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("locks needs a subcommand: %s", locksSubcommands)
			}
			return usagef("unknown command %q", "locks "+args[0])
		},
	}
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
				c.cmd = cmd
				c.dash = cc.ArgsLenAtDash()
				return c.runBounded(cc.Context(), cmd, args)
			},
		}
		if cmd.flags != nil {
			cmd.flags(c, cc.Flags())
		}
		parent.AddCommand(cc)
	}
	return root
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

// valueFlags are the flags that take a value, whose value normalizeArgs
// leaves alone.
var valueFlags = map[string]bool{"db": true, "deadline": true, "owner": true, "ttl": true, "timeout": true, "grace": true, "type": true}

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

// pflag's messages, and the words agents has always used for them: scripts
// and the docs quote them.
var (
	unknownFlag  = regexp.MustCompile(`^unknown (?:shorthand )?flag: (?:'\w' in )?-{1,2}(\S+)$`)
	invalidValue = regexp.MustCompile(`^invalid argument (".*") for "(?:-\w, )?--(\S+)" flag: (.*)$`)
	needsValue   = regexp.MustCompile(`^flag needs an argument: (?:'\w' in )?-{1,2}(\S+)$`)
)

// flagError turns an error of pflag into a usage error, in agents' words.
func flagError(err error) error {
	if errors.Is(err, pflag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if m := unknownFlag.FindStringSubmatch(msg); m != nil {
		msg = "flag provided but not defined: -" + m[1]
	} else if m := invalidValue.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("invalid value %s for flag -%s: %s", m[1], m[2], m[3])
	} else if m := needsValue.FindStringSubmatch(msg); m != nil {
		msg = "flag needs an argument: -" + m[1]
	}
	return &usageError{msg: msg}
}

// version is what "agents --version" prints: the module's version and the
// VCS revision it was built from, as the Go toolchain recorded them.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "agents (unknown version: built without module information)"
	}
	v := "agents " + info.Main.Version
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" {
		v += ", revision " + rev
		if modified == "true" {
			v += " (modified)"
		}
	}
	return v + ", " + info.GoVersion
}
