package locks

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/internal/backend"
)

// openMemory opens MemoryDatabase: a store no other process shares, in
// no SQL database.
func openMemory(_ context.Context, opts backend.Options) (backend.Store, error) {
	clk := opts.Clock
	if clk == nil {
		clk = clock.New()
	}
	return memoryStore{repo: memory.NewLockRepository(), clock: clk}, nil
}

// memoryStore keeps the locks in this process's memory: no other process
// shares them to wake, and there is no SQL transaction to fence or queue.
type memoryStore struct {
	repo  *memory.LockRepository
	clock application.Clock
}

func (m memoryStore) Repository() application.LockRepository { return m.repo }
func (m memoryStore) Clock() application.Clock               { return m.clock }
func (m memoryStore) Wakeups() application.Wakeups           { return nil }
func (m memoryStore) Close(context.Context) error            { return nil }
func (m memoryStore) Writer() func(context.Context, func(context.Context, *sql.Tx) error) error {
	return nil
}

func (m memoryStore) CheckFence(context.Context, Querier, application.Fence, time.Time, backend.ReadLock) error {
	return &domain.StoreError{Op: "fenced write", Kind: domain.StoreInternal, Err: errNoSQL}
}

// errNoSQL is why CheckFence cannot work on a memory store.
var errNoSQL = errors.New("the locks are kept in this process's memory (MemoryDatabase), not in a SQL database: " +
	"there is no transaction to fence; open the container on the SQLite file or PostgreSQL database that holds the plans")
