package postgres

import (
	"context"

	"entgo.io/ent/dialect"
	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/internal/backend"
)

// Importing this package is what lets locks.Open open a PostgreSQL DSN:
// a program that only uses SQLite does not import it, and links neither
// this package nor pgx.
func init() {
	backend.Register(backend.Backend{
		Name:             backend.Postgres,
		Dialect:          dialect.Postgres,
		Open:             openBackend,
		FormatError:      FormatError,
		SnapshotConflict: SnapshotConflict,
		CheckFence:       CheckFence,
		StaleFence:       StaleFence,
	})
}

// openBackend connects to the server and decides expiry on the server's
// clock (its time read at a measurement, plus the local monotonic time
// elapsed since), so that hosts whose clocks disagree, or are stepped,
// never take a live lock early; opts.LocalTime keeps the local clock, for
// tests that drive a mock clock. Without opts.Clock the elapsed time
// counts the host's sleep (SystemClock). Close stops the clock's
// refreshes, then closes the pool.
func openBackend(ctx context.Context, opts backend.Options) (*backend.Store, error) {
	db, err := Open(ctx, opts.Database, Options{LocalTime: opts.LocalTime})
	if err != nil {
		return nil, err
	}
	local := opts.Clock
	if local == nil {
		local = clock.New()
	}
	s := &backend.Store{Repository: NewLockRepository(db), Clock: local, Wakeups: db.Wakeups(), Close: db.CloseContext}
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
	s.Clock = c
	s.Close = func(ctx context.Context) error {
		c.Close()
		return db.CloseContext(ctx)
	}
	return s, nil
}
