package locks

import (
	"context"
	"fmt"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/proc"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/adapters/telemetry"
	"github.com/cleveragents/locks/application"
)

// The providers that wire.go assembles. They are plain functions, so that
// wire_gen.go stays readable and could be written by hand.

func provideClock(cfg Config) application.Clock {
	if cfg.Clock == nil {
		return clock.New()
	}
	return cfg.Clock
}

// provideService builds the lock service and connects it to the
// embedder's logger and metrics, if any; its cleanup unregisters the
// metrics' callback, after the container's cleanup has closed the service.
// providePostgresClock decides expiry on the server's clock (its time
// read at a measurement, plus the local monotonic time elapsed since), so
// that hosts whose clocks disagree, or are stepped, never take a live lock
// early; Config.LocalTime keeps the local clock, for tests that drive a
// mock clock. Without Config.Clock the elapsed time counts the host's
// sleep (postgres.SystemClock). Its cleanup stops the refreshes.
func providePostgresClock(ctx context.Context, cfg Config, db *postgres.DB) (application.Clock, func(), error) {
	local := provideClock(cfg)
	if cfg.LocalTime {
		return local, func() {}, nil
	}
	if cfg.Clock == nil {
		local = postgres.SystemClock{}
	}
	c, err := postgres.NewServerClock(ctx, db, local)
	if err != nil {
		return nil, nil, err
	}
	return c, c.Close, nil
}

func provideService(repo application.LockRepository, clk application.Clock, wake application.Wakeups, cfg Config) (*application.LockService, func(), error) {
	svc, err := application.NewLockService(repo, clk, cfg.DefaultTTL)
	if err != nil {
		return nil, nil, err
	}
	svc.SetWakeups(wake)
	if !cfg.DisableDeadHolderTakeover {
		if m, err := proc.ThisMachine(); err == nil { // no /proc: no process is proven gone
			svc.SetProcesses(m)
		}
	}
	var observers telemetry.Observers
	if cfg.Logger != nil {
		observers = append(observers, telemetry.NewLogger(cfg.Logger))
	}
	cleanup := func() {}
	if cfg.MeterProvider != nil {
		m, err := telemetry.NewMetrics(cfg.MeterProvider, func(ctx context.Context) (int, error) {
			active, err := svc.List(ctx, application.ListOptions{})
			return len(active), err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("registering the lock metrics: %w", err)
		}
		observers = append(observers, m)
		cleanup = func() { _ = m.Close() }
	}
	if len(observers) > 0 {
		svc.SetObserver(observers)
	}
	return svc, cleanup, nil
}

// provideSQLite opens the database; its cleanup closes it, after the
// container's cleanup has released the owner's locks (Wire runs a
// provider's cleanup before those of its inputs).
func provideSQLite(ctx context.Context, cfg Config, sd *shutdown) (*sqlite.DB, func(), error) {
	db, err := sqlite.Open(ctx, cfg.Database, sqlite.Options{BusyTimeout: cfg.BusyTimeout})
	if err != nil {
		return nil, nil, err
	}
	return db, func() { sd.add(db.Close()) }, nil
}

// providePostgres connects to the server; its cleanup closes the pool,
// after the container's cleanup, like provideSQLite's.
func providePostgres(ctx context.Context, cfg Config, sd *shutdown) (*postgres.DB, func(), error) {
	db, err := postgres.Open(ctx, cfg.Database, postgres.Options{LocalTime: cfg.LocalTime})
	if err != nil {
		return nil, nil, err
	}
	return db, func() { sd.add(db.Close()) }, nil
}

func provideMemory() *memory.LockRepository { return memory.NewLockRepository() }

// provideSQLiteWakeups lets waiters sleep until a holder in another
// process on the same file lets go (nil where the system cannot).
func provideSQLiteWakeups(db *sqlite.DB) application.Wakeups { return db.Wakeups() }

// providePostgresWakeups lets waiters sleep until a holder in another
// process, on this host or another, lets go: the server's notifications.
func providePostgresWakeups(db *postgres.DB) application.Wakeups { return db.Wakeups() }

// provideNoWakeups is for a store no other process shares (memory).
func provideNoWakeups() application.Wakeups { return nil }

// newContainer runs the startup cleanup, so that locks left by a process
// that died are gone before anyone asks for them, and starts the periodic
// cleanup if asked. Its cleanup, run by Close before the store closes,
// stops the periodic cleanup first (Close must not wait for a purge, and
// no goroutine may outlive the container), then shuts the service (later
// calls fail with domain.ErrClosed, and the calls in flight finish) and
// only then releases the owner's locks, through the repository itself:
// nothing the service admitted can commit a lock after that release.
func newContainer(ctx context.Context, svc *application.LockService, repo application.LockRepository, clk application.Clock,
	cfg Config, sd *shutdown, write appWriter) (*Container, func(), error) {
	c := &Container{Locks: svc, owner: cfg.Owner, clock: clk, keep: cfg.KeepLocksOnClose, shutdown: sd, write: write}
	if !cfg.SkipStartupCleanup {
		if _, err := svc.CleanupExpired(ctx); err != nil {
			return nil, nil, err
		}
	}
	var periodic *application.PeriodicCleanup
	if cfg.CleanupInterval != 0 {
		var err error
		if periodic, err = svc.StartCleanup(cfg.CleanupInterval, cfg.OnCleanup); err != nil {
			return nil, nil, err
		}
	}
	release := func() {
		if periodic != nil {
			periodic.Stop()
		}
		if err := svc.Close(c.closeCtx); err != nil {
			sd.add(err)
			return
		}
		if c.keep {
			return
		}
		_, err := repo.DeleteAllOwned(c.closeCtx, c.owner)
		sd.add(err)
	}
	return c, release, nil
}
