// Package locks is the advisory-lock module of CleverAgents: it stops two
// processes from changing the same plan or project at once. Open builds a
// Container on a SQLite file, a PostgreSQL server or memory, whose Locks
// service takes, renews and releases locks.
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
// memory: for tests, and for excluding only this process's goroutines.
const MemoryDatabase = ":memory:"

// DefaultShutdownTimeout bounds how long Close waits to release the owner's locks.
const DefaultShutdownTimeout = 10 * time.Second

// Config says how to build a Container. Only Database is required.
type Config struct {
	// Database is a SQLite file (a path or a "file:" URI), a PostgreSQL DSN
	// (with PostgresPackage imported) or MemoryDatabase: see ValidateDatabase.
	Database   string
	Owner      string            // identifies this process in its locks; empty means DefaultOwner()
	DefaultTTL time.Duration     // replaces a zero TTL; zero means domain.DefaultLockTTL
	Clock      application.Clock // the service's time (nil: the real clock); a mock clock implies LocalTime
	// DisableDeadHolderTakeover waits for the expiry even of a lock whose local process is gone.
	DisableDeadHolderTakeover bool
	// LocalTime, on PostgreSQL, decides expiry on Clock rather than on the
	// server's time, advanced by a monotonic clock: only where clocks agree.
	LocalTime   bool
	BusyTimeout time.Duration // how long a SQLite statement waits for another process's write; zero: 5 s
	// PollOnly makes waits poll the store rather than also watch for
	// releases, and keep-alives learn of a loss only at their renewals: a
	// watch's read never blocks durably in a testing/synctest bubble.
	PollOnly           bool
	SkipStartupCleanup bool                 // leaves expired locks in place when opening
	Logger             *slog.Logger         // when set, receives every lock event (telemetry.Logger)
	MeterProvider      metric.MeterProvider // when set, receives the metrics (telemetry.Metrics)
	Observer           application.Observer // when set, is told of every lock event too
	// CleanupInterval, if not zero (≥ application.MinCleanupInterval), purges expired locks that often.
	CleanupInterval time.Duration
	// OnCleanup, when set, is told of every periodic cleanup's count and
	// error, in its goroutine: it must return promptly.
	OnCleanup func(purged int, err error)
	// KeepLocksOnClose makes Close leave the owner's locks to expire, for a
	// process that exits holding one on purpose, such as the agents CLI.
	KeepLocksOnClose bool
	// ShareOwner lets other processes open the database with Owner while
	// this container is open, and this one open beside them: Open neither
	// claims Owner nor checks it (see Open). For a process that acts for an
	// owner id another process uses, as the agents CLI does for --owner.
	// It requires KeepLocksOnClose: Close would otherwise release the
	// locks of every process of the owner.
	ShareOwner bool
}

// Container is the lock module as the application container embeds it.
type Container struct {
	// Locks applies the lock rules. Most callers pass Owner() as the owner.
	Locks *application.LockService

	owner    string
	clock    application.Clock
	store    backend.Store
	shutdown *shutdown
	cleanup  func()
	once     sync.Once
	write    appWriter // nil but on SQLite
	closing  atomic.Bool
}

// Open builds the container that cfg describes: it claims the owner id
// (unless cfg.ShareOwner), migrates the store, purges expired locks
// (unless cfg.SkipStartupCleanup) and starts the periodic cleanup.
//
// The claim makes an owner id one container's at a time on a database:
// while a container is open with it, in this process or another, Open
// refuses it, before it writes anything. Close frees it at once, and so
// does the end of the process, however it ends. On SQLite it is a kernel
// lock in the wake file (Linux only; elsewhere Open claims nothing), on
// PostgreSQL a session advisory lock (docs/holding.md, "One owner id, one
// open container").
//
// Errors: *domain.ValidationError for a bad Config (a PostgreSQL DSN
// without PostgresPackage imported too); *domain.OwnerInUseError when
// another open container claims cfg.Owner; *domain.StoreError when the
// store cannot be opened, migrated or cleaned (a refused SQLite file is
// left as it was: see sqlite.Open).
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
	if cfg.ShareOwner && !cfg.KeepLocksOnClose {
		return nil, &domain.ValidationError{Field: "ShareOwner", Reason: "needs KeepLocksOnClose: the Close of a container that shares its owner id " +
			"would release the locks that the owner's other processes hold; set KeepLocksOnClose too, or give this process an owner id of its own"}
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
			return nil, invalidDatabase("names a PostgreSQL server, which this program cannot open: import " + PostgresPackage + " to enable PostgreSQL")
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

// Clock returns the clock the container decides expiry on: Config.Clock,
// corrected to the server's time on PostgreSQL (see Config.Clock).
func (c *Container) Clock() application.Clock { return c.clock }

// Close stops the periodic cleanup, refuses new calls (domain.ErrClosed),
// lets the calls in progress finish, releases the owner's locks (unless
// Config.KeepLocksOnClose) and closes the store, within
// DefaultShutdownTimeout: if calls still run by then, it releases nothing,
// since they could take locks after the release. Only the first call acts.
func (c *Container) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultShutdownTimeout)
	defer cancel()
	return c.shutdownWithin(ctx, "Close's "+DefaultShutdownTimeout.String())
}

// Shutdown is Close within ctx; on PostgreSQL, the farewell to the other
// processes takes at most half of what remains of it.
func (c *Container) Shutdown(ctx context.Context) error {
	budget := "its context, which has no deadline"
	if d, ok := ctx.Deadline(); ok {
		budget = "its context's deadline, " + d.UTC().Format(time.RFC3339Nano)
	}
	return c.shutdownWithin(ctx, budget)
}

// shutdownWithin runs Wire's cleanups once; budget names ctx's time.
func (c *Container) shutdownWithin(ctx context.Context, budget string) error {
	c.once.Do(func() {
		c.closing.Store(true)
		c.shutdown.ctx, c.shutdown.budget = ctx, budget
		c.cleanup()
	})
	return errors.Join(c.shutdown.errs...)
}

// DefaultOwner returns an owner id unique to this process: on Linux a
// domain.ProcessOwner, which this machine's other processes can prove
// gone, elsewhere "host:pid:random".
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

// shutdown hands Close's context to Wire's cleanups and collects their
// errors; Close's once.Do orders the writes before the read of errs.
type shutdown struct {
	ctx    context.Context
	budget string // ctx's time, in words, for errors
	errs   []error
}

func newShutdown() *shutdown { return &shutdown{ctx: context.Background()} }

func (s *shutdown) add(err error) {
	if err != nil {
		s.errs = append(s.errs, err)
	}
}
