// Package backend is what locks.Open asks of a kind of database. Each of
// the module's SQL adapters registers its Open from its init, as
// database/sql drivers do, so that a program links a database's code only
// when it imports its package.
package backend

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The names under which the kinds of database register.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// Options are the parts of locks.Config that concern the database.
type Options struct {
	Database    string
	Clock       application.Clock // nil means the real clock
	LocalTime   bool              // also implied by a mock Clock
	BusyTimeout time.Duration
	// Owner, when set, is claimed for as long as the store is open: Open
	// refuses it (*domain.OwnerInUseError) while another open store of
	// the database, in any process, claims it.
	Owner string
}

// Store is an open database of locks, as the container uses it.
type Store interface {
	Repository() application.LockRepository
	Clock() application.Clock     // the clock the service decides expiry on
	Wakeups() application.Wakeups // nil where no release reaches other processes
	// CheckFence is Container.CheckFence (and returns its errors); read reads
	// the lock outside q, to explain a failure on q's old snapshot.
	CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time, read ReadLock) error
	// Writer is the queue Container.Write joins; nil where writers do not exclude each other.
	Writer() func(ctx context.Context, fn func(context.Context, *sql.Tx) error) error
	// Close stops what Open started and closes the database, within ctx, once the owner's locks are released.
	Close(ctx context.Context) error
}

// ReadLock reads the lock on a resource (application.LockService.Get).
type ReadLock func(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error)

// Open opens a database, applies its migrations and returns it.
type Open func(ctx context.Context, opts Options) (Store, error)

// opens needs no lock: only the adapters' init functions write it, and they all run before main.
var opens = map[string]Open{}

// Register makes the kind of database name available to locks.Open; it
// panics on a name registered twice, as sql.Register does.
func Register(name string, open Open) {
	if _, dup := opens[name]; dup {
		panic(fmt.Sprintf("backend: %s registered twice", name))
	}
	opens[name] = open
}

// Lookup returns the Open registered as name.
func Lookup(name string) (Open, bool) {
	open, ok := opens[name]
	return open, ok
}
