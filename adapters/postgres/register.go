package postgres

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/internal/backend"
)

// Importing this package lets locks.Open open a PostgreSQL DSN: a program
// that only uses SQLite links neither it nor pgx.
func init() { backend.Register(backend.Postgres, openStore) }

type store struct {
	db     *DB
	clock  application.Clock
	server *ServerClock // nil with opts.LocalTime
}

// openStore decides expiry on a ServerClock, so that hosts whose clocks
// disagree never take a live lock early (opts.LocalTime: the local clock).
func openStore(ctx context.Context, opts backend.Options) (backend.Store, error) {
	db, err := Open(ctx, opts.Database, Options{LocalTime: opts.LocalTime, Owner: opts.Owner})
	if err != nil {
		return nil, err
	}
	local := opts.Clock
	if local == nil {
		local = clock.New()
	}
	s := &store{db: db, clock: local}
	if opts.LocalTime {
		return s, nil
	}
	if opts.Clock == nil {
		local = SystemClock{}
	}
	c, err := NewServerClock(ctx, db, local)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s.clock, s.server = c, c
	return s, nil
}

func (s *store) Repository() application.LockRepository { return NewLockRepository(s.db) }
func (s *store) Clock() application.Clock               { return s.clock }

func (s *store) Wakeups() application.Wakeups { return s.db.Wakeups() }
func (s *store) Close(ctx context.Context) error {
	if s.server != nil {
		s.server.Close()
	}
	return s.db.CloseContext(ctx)
}

// Writer is nil: writers of different rows do not exclude each other.
func (s *store) Writer() func(ctx context.Context, fn func(context.Context, *sql.Tx) error) error {
	return nil
}

// CheckFence checks f in q (SELECT ... FOR KEY SHARE); a transaction above
// READ COMMITTED, whose snapshot may predate the lock, is told whether the
// lock, read outside it, is held.
func (s *store) CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time, read backend.ReadLock) error {
	err := CheckFence(ctx, q, f, now)
	var stale *domain.StaleSnapshotError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &stale) || SnapshotConflict(err):
		return entstore.ExplainStale(ctx, err, f, now, read, FormatError, func(held *domain.Lock, isolation string, cause error) *domain.StaleSnapshotError {
			return StaleFence(f, isolation, held, cause)
		})
	}
	return entstore.Explain(ctx, err, "fenced write", FormatError)
}
