// Package locks is the advisory-lock module of CleverAgents: it stops two
// processes from changing the same plan or project at once.
//
// Open builds a Container from a Config: it opens the lock store (a SQLite
// file, a PostgreSQL server for locks shared between machines, or memory
// for tests), migrates it, purges the locks that expired while no process
// ran, and returns the container, whose Locks service takes, renews and
// releases locks. Close releases the owner's locks and closes the store.
//
// A program links only the stores it uses: SQLite and memory always, and
// PostgreSQL once it imports its package, as database/sql drivers are:
//
//	import _ "github.com/cleveragents/locks/adapters/postgres"
//
// The rules live in package application, the vocabulary and errors in
// package domain; a store of one's own is checked with package locktest.
package locks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/cleveragents/locks/adapters/proc"
	_ "github.com/cleveragents/locks/adapters/sqlite" // registers SQLite, always linked
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/internal/backend"
)

// MemoryDatabase, as Config.Database, keeps the locks in this process's
// memory: for tests, and for programs that only exclude their own
// goroutines.
const MemoryDatabase = ":memory:"

// DefaultShutdownTimeout bounds how long Close waits to release the
// owner's locks.
const DefaultShutdownTimeout = 10 * time.Second

// Config says how to build a Container. Only Database is required.
type Config struct {
	// Database is a SQLite file (a path, or a "file:" URI), a PostgreSQL
	// DSN (a "postgres://" URL or libpq's "host=... dbname=..."; the
	// program must import PostgresPackage), or MemoryDatabase. A new SQLite
	// file gets mode 0600 in a directory that must exist. Other URLs and a
	// malformed keyword/value string are refused (see ValidateDatabase).
	Database string
	// Owner identifies this process in its locks; empty means
	// DefaultOwner(). Close releases every lock the owner holds.
	Owner string
	// DefaultTTL replaces a zero TTL in Acquire and Renew; zero means
	// domain.DefaultLockTTL.
	DefaultTTL time.Duration
	// Clock is the service's time; nil means the real clock. Tests pass one
	// they move (locktest/testclock, or github.com/benbjohnson/clock's
	// mock; see docs/testing.md). On PostgreSQL expiry is decided on the
	// server's time, advanced by a monotonic clock, so that a step of the
	// wall clock moves nothing; a mock clock (one with Add and Set) implies
	// LocalTime instead, so that moving it moves every lock's expiry.
	Clock application.Clock
	// DisableDeadHolderTakeover makes Acquire wait for the expiry of every
	// active lock. By default a lock whose owner is a DefaultOwner of this
	// machine whose process is provably gone is taken over at once; a
	// stopped process is alive, and explicit owner ids are never taken early.
	DisableDeadHolderTakeover bool
	// LocalTime, on PostgreSQL, decides expiry on Clock alone rather than
	// also on the server's time: for tests that drive a mock clock. Hosts
	// that share locks must not set it unless their clocks agree.
	LocalTime bool
	// BusyTimeout is how long a SQLite statement waits for another
	// process's write; zero means 5 seconds.
	BusyTimeout time.Duration
	// PollOnly makes a wait for a lock held elsewhere poll the store rather
	// than also watch for the holder's release (SQLite's wake file,
	// PostgreSQL's notifications), whose read does not block durably in a
	// testing/synctest bubble (docs/testing.md). A release is then seen at
	// the next poll, up to a second later on Clock.
	PollOnly bool
	// SkipStartupCleanup leaves expired locks in place when opening, for
	// tools that must show them.
	SkipStartupCleanup bool
	// Logger, when set, receives every lock event: changes of hands,
	// releases and cleanups at Info, failed renewals at Warn, re-entries,
	// renewals and refusals at Debug.
	Logger *slog.Logger
	// MeterProvider, when set, receives the module's OpenTelemetry metrics
	// (package adapters/telemetry lists them).
	MeterProvider metric.MeterProvider
	// Observer, when set, is told of every lock event too.
	Observer application.Observer
	// CleanupInterval, when set, purges expired locks every interval (on
	// Clock) while the container is open, so that the locks of processes
	// that died do not pile up in a long-running process. Zero runs none;
	// otherwise it must be at least application.MinCleanupInterval.
	CleanupInterval time.Duration
	// OnCleanup, when set with CleanupInterval, is called after every
	// periodic cleanup with how many locks it purged and its error (a
	// failed one is tried again an interval later). It runs in the
	// cleanup's goroutine and must return promptly.
	OnCleanup func(purged int, err error)
	// KeepLocksOnClose makes Close leave the owner's locks in place, for a
	// process that takes a lock on purpose and exits, such as the agents
	// CLI: they expire with their TTL or are released explicitly.
	KeepLocksOnClose bool
}

// Container is the lock module as the application container embeds it.
type Container struct {
	// Locks applies the lock rules. Most callers pass Owner() as the owner.
	Locks *application.LockService

	owner    string
	clock    application.Clock
	keep     bool
	store    backend.Store
	shutdown *shutdown
	cleanup  func()
	once     sync.Once
	write    appWriter   // nil but on SQLite
	closing  atomic.Bool // Close has begun: Write refuses
}

// Open builds the container that cfg describes: it applies the pending
// migrations, purges expired locks (unless cfg.SkipStartupCleanup) and
// starts the periodic cleanup (when cfg.CleanupInterval is set).
//
// Errors: *domain.ValidationError for a bad Config, including a Database
// that names no kind of database Open accepts (the error lists them) and
// a PostgreSQL DSN in a program that does not import PostgresPackage (the
// error says to import it); *domain.StoreError when the store cannot be
// opened, migrated or cleaned. A SQLite file that Open refuses is left as
// it was; among the refusals (see sqlite.Open), a file with more than one
// name wraps a *sqlite.LinkedFileError, and a file whose locks table the
// store did not create matches sqlite.ErrForeignLocksTable.
func Open(ctx context.Context, cfg Config) (*Container, error) {
	kind, err := databaseKind(cfg.Database)
	if err != nil {
		return nil, err
	}
	if cfg.Owner == "" {
		cfg.Owner = DefaultOwner()
	}
	if err := domain.ValidateOwner(cfg.Owner); err != nil {
		return nil, err
	}
	if cfg.CleanupInterval != 0 {
		if err := application.ValidateCleanupInterval(cfg.CleanupInterval); err != nil {
			return nil, err
		}
	}
	open := openMemory
	if kind != kindMemory {
		var ok bool
		if open, ok = backend.Lookup(kind); !ok {
			return nil, &domain.ValidationError{Field: "database",
				Reason: "names a PostgreSQL server, which this program cannot open: import " + PostgresPackage + " to enable PostgreSQL"}
		}
	}
	c, cleanup, err := openStore(ctx, cfg, open)
	if err != nil {
		return nil, err
	}
	c.cleanup = cleanup
	return c, nil
}

// Owner returns the owner id this container acts for.
func (c *Container) Owner() string { return c.owner }

// Clock returns the clock the container decides expiry on: Config.Clock
// (or the real clock), corrected to the server's time on PostgreSQL
// unless Config.LocalTime or Config.Clock is a mock clock.
func (c *Container) Clock() application.Clock { return c.clock }

// Close shuts the container down, in this order: the periodic cleanup
// stops, the lock service refuses new calls (domain.ErrClosed), the calls
// in progress finish, the owner's locks are released (unless
// Config.KeepLocksOnClose), and the store closes. It waits at most
// DefaultShutdownTimeout; if calls are still in progress by then, it
// releases nothing and says so, since they could take locks after the
// release. Only the first call does anything.
func (c *Container) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultShutdownTimeout)
	defer cancel()
	return c.shutdownWithin(ctx, "Close's "+DefaultShutdownTimeout.String())
}

// Shutdown is Close within ctx: on PostgreSQL, the farewell to the other
// processes (that this one waits for no lock any more) takes at most half
// of what remains of ctx, and none once it has ended.
func (c *Container) Shutdown(ctx context.Context) error {
	budget := "its context, which has no deadline"
	if d, ok := ctx.Deadline(); ok {
		budget = "its context's deadline, " + d.UTC().Format(time.RFC3339Nano)
	}
	return c.shutdownWithin(ctx, budget)
}

// shutdownWithin runs Wire's cleanups once; budget names, for their
// errors, the time ctx gives.
func (c *Container) shutdownWithin(ctx context.Context, budget string) error {
	c.once.Do(func() {
		c.closing.Store(true)
		c.shutdown.ctx, c.shutdown.budget = ctx, budget
		c.cleanup()
	})
	return errors.Join(c.shutdown.errs...)
}

// DefaultOwner returns an owner id that identifies this process: on Linux
// a domain.ProcessOwner, which another process of this machine can prove
// gone (see Config.DisableDeadHolderTakeover), elsewhere
// "host:pid:random". Both are unique even when a pid is reused.
func DefaultOwner() string {
	if m, err := proc.ThisMachine(); err == nil {
		if p, err := m.Owner(os.Getpid()); err == nil {
			return p.String()
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", proc.Hostname(), os.Getpid(), hex.EncodeToString(b[:]))
}

// shutdown hands the context of the Close or Shutdown in progress to the
// cleanups that Wire runs, and collects their errors. It needs no mutex:
// the cleanups run inside Close's sync.Once, and errs is read after it.
type shutdown struct {
	ctx    context.Context
	budget string // the time ctx gives, in words
	errs   []error
}

func newShutdown() *shutdown { return &shutdown{ctx: context.Background()} }

func (s *shutdown) add(err error) {
	if err != nil {
		s.errs = append(s.errs, err)
	}
}
