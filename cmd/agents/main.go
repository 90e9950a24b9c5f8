// Command agents inspects and operates the advisory locks of CleverAgents,
// in the same database as the application that embeds the lock module (a
// SQLite file, or a PostgreSQL server named by a postgres:// URL), running
// no server of its own: who holds what, taking and releasing locks by hand,
// purging expired locks, running a command under a lock, and the
// diagnostics of the lock store.
//
// Usage:
//
//	agents [--db PATH] [--json] COMMAND [ARGS] [FLAGS]
//
// Run "agents -h" for the commands, "agents COMMAND -h" for the flags of
// one (--owner, --ttl, ...), and see docs/cli.md for the exit codes and
// the JSON shapes, which scripts may depend on. "agents --version" and
// "agents completion bash|zsh|fish" come with the cobra command tree.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/benbjohnson/clock"
)

func main() {
	// An interrupt cancels the command in progress; so does a hangup (a
	// closed terminal, a shell that hangs up its jobs), which would
	// otherwise end agents with nothing cleaned up and, under "locks
	// run", leave CMD running under a lock nobody renews. "locks run"
	// catches the same signals itself once its command runs, and forwards
	// them to it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	m := &Main{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Env: os.Getenv, Clock: clock.New()}
	code := m.Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
