// Package backend is where an optional lock store registers itself with
// the root package, as database/sql drivers and image decoders do: the
// store's package calls Register from an init function, and locks.Open
// finds it with Lookup. A program links a store's code, and its driver's,
// only when it imports that store's package.
//
// It is internal: the stores that register are the module's own
// (adapters/postgres); other stores are tested with package locktest and
// served by an application.LockService of their own.
package backend

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Postgres is the name adapters/postgres registers, and the one Open looks
// up for a PostgreSQL DSN.
const Postgres = "postgres"

// Options is what a store is opened with: the parts of locks.Config that
// concern it.
type Options struct {
	// Database is the DSN, as given in locks.Config.Database.
	Database string
	// Clock is locks.Config.Clock; nil means the real clock.
	Clock application.Clock
	// LocalTime is locks.Config.LocalTime.
	LocalTime bool
}

// Store is an open store: what the container runs its service on.
type Store struct {
	Repository application.LockRepository
	// Clock is the clock the service decides expiry on.
	Clock   application.Clock
	Wakeups application.Wakeups
	// Close stops whatever Open started and closes the database; the
	// container calls it last, after releasing its owner's locks, with
	// the context of its Close or Shutdown, whose deadline bounds what
	// closing waits for the server.
	Close func(ctx context.Context) error
}

// Backend is a kind of store that Open can open.
type Backend struct {
	// Name is the kind of database, as locks.Open names it ("postgres").
	Name string
	// Dialect is Ent's name of the database, for Container.CheckFence.
	Dialect string
	// Open opens the store, applies its migrations and returns it.
	Open func(ctx context.Context, opts Options) (*Store, error)
	// FormatError translates a driver's error into the domain's.
	FormatError func(op string, err error) error
	// SnapshotConflict reports a refusal of a fenced write because the
	// transaction's snapshot is older than a change of the lock.
	SnapshotConflict func(err error) bool
	// CheckFence checks a fence inside the caller's transaction q.
	CheckFence func(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time) error
	// StaleFence is the error of a fence that failed on its transaction's
	// old snapshot while the lock, read outside it, is held (held) or
	// unknown (nil).
	StaleFence func(f application.Fence, isolation string, held *domain.Lock, cause error) *domain.StaleSnapshotError
}

var (
	mu       sync.RWMutex
	backends = map[string]Backend{}
)

// Register makes b available to locks.Open. Registering a name twice is a
// programming error, and panics, as sql.Register does.
func Register(b Backend) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := backends[b.Name]; dup {
		panic(fmt.Sprintf("backend: %s registered twice", b.Name))
	}
	backends[b.Name] = b
}

// Lookup returns the backend registered as name.
func Lookup(name string) (Backend, bool) {
	mu.RLock()
	defer mu.RUnlock()
	b, ok := backends[name]
	return b, ok
}
