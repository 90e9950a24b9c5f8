// Package locks is the advisory-lock module of CleverAgents: it stops two
// processes from changing the same plan or project at once.
//
// Open builds a Container from a Config: it opens the lock store (a SQLite
// file by default, PostgreSQL for locks shared between machines, or memory
// for tests), applies the schema migrations,
// purges locks that expired while no process was running, and returns the
// container, whose Locks service takes, renews and releases locks. Close
// releases every lock the container's owner still holds, then closes the
// store, so that other processes can take the resources at once.
//
// A program links only the stores it uses. SQLite and memory are always
// there; PostgreSQL is enabled by importing its package, as database/sql
// drivers are:
//
//	import _ "github.com/cleveragents/locks/adapters/postgres"
//
// The rules themselves live in package application, the vocabulary and the
// errors in package domain. A store of one's own is checked with package
// locktest and run by an application.LockService.
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

// MemoryDatabase, as Config.Database, keeps the locks in the memory of this
// process: for tests, and for programs that only need to exclude their own
// goroutines.
const MemoryDatabase = ":memory:"

// DefaultShutdownTimeout bounds how long Close waits to release the
// owner's locks.
const DefaultShutdownTimeout = 10 * time.Second

// Config says how to build a Container. Only Database is required.
type Config struct {
	// Database is the SQLite file (a path, or a "file:" URI with extra
	// parameters), a PostgreSQL DSN (a "postgres://..." URL, or libpq's
	// "host=... dbname=..." form; the program must import PostgresPackage),
	// or MemoryDatabase. A new SQLite file is created with mode 0600; its
	// directory must exist. A URL of any other scheme (mysql://, http://)
	// is refused, and so is a string that reads as libpq's keyword/value
	// form but is malformed (see ValidateDatabase): it never names a file.
	Database string
	// Owner identifies this process in the locks it takes; empty means
	// DefaultOwner(). Every lock the owner holds is released by Close.
	Owner string
	// DefaultTTL replaces a zero TTL in Acquire and Renew; zero means
	// domain.DefaultLockTTL (5 minutes).
	DefaultTTL time.Duration
	// Clock is where the service reads the time; nil means the real clock.
	// Tests pass a mock clock that they move: testclock.New() from
	// locktest/testclock (see docs/testing.md), or clock.NewMock() from
	// github.com/benbjohnson/clock. On PostgreSQL, expiry is decided on
	// the server's time: its time at the last measurement plus the time
	// elapsed since, measured on this clock's monotonic reading if it is a
	// postgres.MonotonicClock, and otherwise on the host's own monotonic
	// clock, never on the readings' wall time, so a step of the wall clock
	// moves nothing, even for a clock whose readings carry no monotonic
	// reading (time.Now().UTC()). The exception is a mock clock, one with
	// the methods Add(time.Duration) and Set(time.Time) as both of those
	// have: its time is the test's, and expiry is decided on it alone, as
	// with LocalTime, which it implies, so that moving it moves every
	// lock's expiry on PostgreSQL as on SQLite.
	Clock application.Clock
	// DisableDeadHolderTakeover makes Acquire wait for the expiry of every
	// active lock. By default, an active lock whose owner is a process of
	// this machine (a DefaultOwner id) that is provably gone is taken over
	// at once, with a new token, and reported as a takeover; a stopped
	// process is alive, and explicit owner ids are never taken early.
	DisableDeadHolderTakeover bool
	// LocalTime, on PostgreSQL, decides expiry on Clock as it is rather
	// than on the server's time, and does not also require a lock to have
	// expired on the server's clock before it changes hands: for tests
	// that drive a mock clock, ahead of the server's if they like (a mock
	// clock implies it: see Clock). Hosts that share locks must not set it
	// unless their clocks agree.
	LocalTime bool
	// BusyTimeout is how long a SQLite statement waits for another
	// process's write; zero means 5 seconds.
	BusyTimeout time.Duration
	// PollOnly makes a wait for a lock held by another process (or by an
	// owner-scoped Acquire) poll the store, with a backoff that never
	// sleeps past the holder's expiry, instead of also watching for the
	// holder's release (SQLite's wake file, PostgreSQL's notifications):
	// for a testing/synctest bubble, in which the watch's read does not
	// block durably, so the bubble's time would not move while a waiter
	// waits (see docs/testing.md). A release is then seen at the next
	// poll, up to a second later on the service's clock, instead of at
	// once: with a test clock, only once the test moves it.
	PollOnly bool
	// SkipStartupCleanup leaves expired locks in place when opening, for
	// tools that must show them (diagnostics, listings of expired locks).
	SkipStartupCleanup bool
	// Logger, when set, receives every lock event: acquisitions, takeovers
	// of expired locks (with the previous holder), releases and cleanups at
	// Info, failed renewals at Warn, re-entries, renewals and refusals at
	// Debug.
	Logger *slog.Logger
	// MeterProvider, when set, receives the module's OpenTelemetry metrics
	// (package adapters/telemetry lists them).
	MeterProvider metric.MeterProvider
	// Observer, when set, is told of every lock event too, beside Logger
	// and MeterProvider, from the container's first call on: for a
	// program that acts on them (a supervisor told of each renewal).
	Observer application.Observer
	// CleanupInterval, when set, purges expired locks every interval (on
	// Clock) for as long as the container is open, as the startup cleanup
	// does once: for a long-running process, so that locks left by
	// processes that died do not pile up until the next start. Zero, the
	// default, runs no periodic cleanup; otherwise it must be at least
	// application.MinCleanupInterval.
	CleanupInterval time.Duration
	// OnCleanup, when set with CleanupInterval, is called after every
	// periodic cleanup with how many locks it purged and its error, nil
	// on success. A failed cleanup (a busy database) is tried again an
	// interval later; this is where the application logs it. It runs in
	// the cleanup's goroutine and must return promptly.
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
	store    backend.Store // CheckFence's and Write's
	shutdown *shutdown
	cleanup  func()
	once     sync.Once
	write    appWriter   // Write's, nil but on SQLite
	closing  atomic.Bool // Close has begun: Write refuses
	// closeCtx is the context of the Close call in progress, read by the
	// release-all that Wire's cleanup runs.
	closeCtx    context.Context
	closeBudget string // the time closeCtx gives, in words
}

// Open builds the container that cfg describes. Opening applies the
// pending migrations and then purges expired locks (unless
// cfg.SkipStartupCleanup), and starts the periodic cleanup when
// cfg.CleanupInterval is set.
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
			return nil, notLinked()
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
// stops (a run in progress is cut short), the lock service refuses
// every new call (they fail with domain.ErrClosed), the calls in progress
// finish, every lock of the container's owner is released (unless
// Config.KeepLocksOnClose), and the store closes. It waits at most
// DefaultShutdownTimeout; if calls are still in progress by then, it
// releases nothing and says so, since they could take locks after the
// release. Only the first call does anything.
func (c *Container) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultShutdownTimeout)
	defer cancel()
	return c.shutdownWithin(ctx, "Close's "+DefaultShutdownTimeout.String())
}

// Shutdown is Close with a caller's context for the release of the locks
// and the closing of the store: on PostgreSQL, the store's farewell to
// the other processes (that this one waits for no lock any more) takes
// at most half of what remains of ctx, and none once it has ended.
func (c *Container) Shutdown(ctx context.Context) error {
	budget := "its context, which has no deadline"
	if d, ok := ctx.Deadline(); ok {
		budget = "its context's deadline, " + d.UTC().Format(time.RFC3339Nano)
	}
	return c.shutdownWithin(ctx, budget)
}

// shutdownWithin shuts the container down once; budget names the time
// ctx gives it, for its errors.
func (c *Container) shutdownWithin(ctx context.Context, budget string) error {
	c.once.Do(func() {
		c.closing.Store(true)
		c.closeCtx, c.closeBudget = ctx, budget
		c.shutdown.setContext(ctx)
		c.cleanup()
	})
	return c.shutdown.err()
}

// DefaultOwner returns an owner id that identifies this process. On Linux
// it is a domain.ProcessOwner, "host:pid:random/proc1:boot-id:pid-ns:start",
// precise enough for another process of this machine to prove it gone (and
// take its locks over at once; see Config.DisableDeadHolderTakeover).
// Elsewhere it is "host:pid:random". Both are unique even when a pid is
// reused.
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

// shutdown collects the errors of the cleanups that Wire runs on Close,
// and gives them the context of the Close or Shutdown that runs them.
type shutdown struct {
	mu   sync.Mutex
	errs []error
	ctx  context.Context
}

// setContext records the context of the Close or Shutdown in progress,
// before the cleanups run.
func (s *shutdown) setContext(ctx context.Context) {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
}

// context returns the context of the Close or Shutdown in progress:
// closing the store waits for the server within its deadline.
func (s *shutdown) context() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil {
		return context.Background()
	}
	return s.ctx
}

func newShutdown() *shutdown { return &shutdown{} }

func (s *shutdown) add(err error) {
	if err != nil {
		s.mu.Lock()
		s.errs = append(s.errs, err)
		s.mu.Unlock()
	}
}

func (s *shutdown) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}
