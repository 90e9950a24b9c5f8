// Package backend is what locks.Open asks of a kind of database: Open
// opens it and returns a Store, through which the container runs its
// service, checks fences and queues the application's writes. Each kind
// registers its Open from its package's init, as database/sql drivers
// do, so that a program links a database's code, and its driver's, only
// when it imports its package; locks.Open finds it with Lookup.
//
// It is internal: the databases that register are the module's own
// (adapters/sqlite, adapters/postgres); other stores are tested with
// package locktest and served by an application.LockService of their own.
package backend

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The kinds of database that register, by the names Open looks up.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// Options is what a database is opened with: the parts of locks.Config
// that concern it.
type Options struct {
	// Database is the DSN, as given in locks.Config.Database.
	Database string
	// Clock is locks.Config.Clock; nil means the real clock.
	Clock application.Clock
	// LocalTime is locks.Config.LocalTime, or implied by a mock Clock.
	LocalTime bool
	// BusyTimeout is locks.Config.BusyTimeout.
	BusyTimeout time.Duration
}

// Store is an open database of locks, as the container uses it.
type Store interface {
	// Repository is where the service keeps the locks.
	Repository() application.LockRepository
	// Clock is the clock the service decides expiry on.
	Clock() application.Clock
	// Wakeups carries releases between processes; nil where none can.
	Wakeups() application.Wakeups
	// CheckFence is Container.CheckFence on this database: now is the
	// service's time, and read reads a lock as committed, outside q, to
	// explain a check that failed on q's old snapshot.
	CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time, read ReadLock) error
	// Writer is the queue that Container.Write joins, nil where the
	// database has none (its writers do not exclude each other).
	Writer() func(ctx context.Context, fn func(context.Context, *sql.Tx) error) error
	// Close stops whatever Open started and closes the database; the
	// container calls it last, after releasing its owner's locks, with
	// the context of its Close or Shutdown, whose deadline bounds what
	// closing waits for the server.
	Close(ctx context.Context) error
}

// ReadLock reads the lock on a resource (application.LockService.Get).
type ReadLock func(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error)

// Open opens a database, applies its migrations and returns it.
type Open func(ctx context.Context, opts Options) (Store, error)

var (
	mu    sync.RWMutex
	opens = map[string]Open{}
)

// Register makes the kind of database name available to locks.Open.
// Registering a name twice is a programming error, and panics, as
// sql.Register does.
func Register(name string, open Open) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := opens[name]; dup {
		panic(fmt.Sprintf("backend: %s registered twice", name))
	}
	opens[name] = open
}

// Lookup returns the Open registered as name.
func Lookup(name string) (Open, bool) {
	mu.RLock()
	defer mu.RUnlock()
	open, ok := opens[name]
	return open, ok
}
