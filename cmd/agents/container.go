package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
)

// open builds the same container as an application that embeds the lock
// module, so that the CLI sees the same store, migrations and startup
// cleanup. Three settings are the CLI's own:
//
//   - KeepLocksOnClose, always: the container of an embedder releases its
//     owner's locks on Close, but "agents locks acquire" exists to leave a
//     lock behind when it exits, and the owner it acts for may be a
//     running application's (docs/cli.md explains it in full);
//   - ShareOwner, always, for that same reason: the application's
//     container claims its owner id, and an operator's command acts for
//     it beside it (as do two "locks run" with one --owner);
//   - SkipStartupCleanup, when asked: for the commands that must see the
//     expired locks (list --all, and cleanup, which counts what it purges).
//
// access says whether the command may create the database (see
// checkStore): the default database, or with --create the one that --db
// names. The default database gets its directory, private to the user,
// when a command that may create it runs first; any other must be in a
// directory that exists.
func (c *invocation) open(ctx context.Context, owner string, skipCleanup bool, access storeAccess) (*locks.Container, error) {
	return c.openWith(ctx, locks.Config{Owner: owner, SkipStartupCleanup: skipCleanup}, access)
}

// openObserved is open for a command that acts on the lock events (run,
// told of each renewal): obs sees them from the container's first call.
func (c *invocation) openObserved(ctx context.Context, owner string, access storeAccess, obs application.Observer) (*locks.Container, error) {
	return c.openWith(ctx, locks.Config{Owner: owner, Observer: obs}, access)
}

// openWith is open with cfg's Owner, SkipStartupCleanup and Observer.
func (c *invocation) openWith(ctx context.Context, cfg locks.Config, access storeAccess) (*locks.Container, error) {
	db, isDefault, err := c.database()
	if err != nil {
		return nil, err
	}
	if err := c.checkStore(ctx, db, isDefault, access); err != nil {
		return nil, err
	}
	if isDefault && access == mayCreate {
		if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
			return nil, fmt.Errorf("creating the data directory: %w", err)
		}
	}
	// Opening is bounded even for a command whose wait is not (waits).
	ctx, cancel, err := c.bound(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	// SQLite waits for another process's write lock in C, where the
	// context does not reach: a shorter deadline shortens that wait too.
	deadline, _ := c.deadline()
	cfg.BusyTimeout = min(deadline, sqlite.DefaultBusyTimeout)
	cfg.Database = db
	cfg.Clock = c.clock
	cfg.LocalTime = c.localTime
	cfg.KeepLocksOnClose = true
	cfg.ShareOwner = true
	return locks.Open(ctx, cfg)
}

// close closes the container within the deadline (and Close's own
// bound, if shorter): against a server that went silent, closing waits
// for it no longer than the command's other statements do. The command's
// result is out already, so a failure to close is a warning, not a
// change of the exit code.
func (c *invocation) close(ctr *locks.Container) {
	bound := locks.DefaultShutdownTimeout
	if d, err := c.deadline(); err == nil {
		bound = min(bound, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := ctr.Shutdown(ctx); err != nil {
		fmt.Fprintf(c.stderr, "%s: warning: %s\n", c.prog(), c.redact(err.Error()))
	}
}
