package locks

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cleveragents/locks/adapters/proc"
	"github.com/cleveragents/locks/adapters/telemetry"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/internal/backend"
)

// The providers that wire.go assembles. They are plain functions, so that
// wire_gen.go stays readable and could be written by hand.

// provideService builds the lock service with its ports: the store's
// wake-ups (unless cfg.PollOnly), this machine's process table (unless
// cfg.DisableDeadHolderTakeover), and the embedder's logger and metrics,
// if any; its cleanup unregisters the metrics' callback, after the
// container's cleanup has closed the service.
func provideService(repo application.LockRepository, clk application.Clock, wake application.Wakeups, cfg Config) (*application.LockService, func(), error) {
	var opts []application.Option
	if !cfg.PollOnly {
		opts = append(opts, application.WithWakeups(wake))
	}
	if !cfg.DisableDeadHolderTakeover {
		if m, err := proc.ThisMachine(); err == nil { // no /proc: no process is proven gone
			opts = append(opts, application.WithProcesses(m))
		}
	}
	var observers telemetry.Observers
	if cfg.Logger != nil {
		observers = append(observers, telemetry.NewLogger(cfg.Logger))
	}
	if cfg.Observer != nil {
		observers = append(observers, cfg.Observer)
	}
	cleanup := func() {}
	// The gauge of active locks asks the service, which is made once the
	// metrics are: until then there is nothing to report.
	var made atomic.Pointer[application.LockService]
	if cfg.MeterProvider != nil {
		m, err := telemetry.NewMetrics(cfg.MeterProvider, func(ctx context.Context) (int, error) {
			svc := made.Load()
			if svc == nil {
				return 0, domain.ErrClosed
			}
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
		opts = append(opts, application.WithObserver(observers))
	}
	svc, err := application.NewLockService(repo, clk, cfg.DefaultTTL, opts...)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	made.Store(svc)
	return svc, cleanup, nil
}

// provideStore opens the database; its cleanup closes it, after the
// container's cleanup has released the owner's locks (Wire runs a
// provider's cleanup before those of its inputs), with the context of
// the container's Close or Shutdown.
func provideStore(ctx context.Context, cfg Config, open backend.Open, sd *shutdown) (backend.Store, func(), error) {
	s, err := open(ctx, backend.Options{Database: cfg.Database, Clock: cfg.Clock,
		LocalTime: cfg.LocalTime || isMock(cfg.Clock), BusyTimeout: cfg.BusyTimeout})
	if err != nil {
		return nil, nil, err
	}
	return s, func() { sd.add(s.Close(sd.context())) }, nil
}

// mockClock is what a test's clock has that a real one has not: a way to
// move it. Both testclock.Clock and clock.Mock have it.
type mockClock interface {
	Add(time.Duration)
	Set(time.Time)
}

// isMock says whether clk is a clock the test moves: its time is the
// test's, so expiry is decided on it alone, never on a server's clock
// that the test cannot move (Config.Clock).
func isMock(clk application.Clock) bool {
	_, ok := clk.(mockClock)
	return ok
}

// The parts of the store that the service uses.

func provideRepository(s backend.Store) application.LockRepository { return s.Repository() }
func provideClock(s backend.Store) application.Clock               { return s.Clock() }
func provideWakeups(s backend.Store) application.Wakeups           { return s.Wakeups() }

// newContainer runs the startup cleanup, so that locks left by a process
// that died are gone before anyone asks for them, and starts the periodic
// cleanup if asked. Its cleanup, run by Close before the store closes,
// stops the periodic cleanup first (Close must not wait for a purge, and
// no goroutine may outlive the container), then shuts the service (later
// calls fail with domain.ErrClosed, and the calls in flight finish) and
// only then releases the owner's locks, through the repository itself:
// nothing the service admitted can commit a lock after that release.
func newContainer(ctx context.Context, svc *application.LockService, s backend.Store, repo application.LockRepository, clk application.Clock,
	cfg Config, sd *shutdown) (*Container, func(), error) {
	c := &Container{Locks: svc, owner: cfg.Owner, clock: clk, keep: cfg.KeepLocksOnClose, store: s, shutdown: sd, write: s.Writer()}
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
			// The calls in flight did not end in time: releasing now could
			// race one that commits a lock after the release.
			what := "they stay held until their TTL, or until released elsewhere"
			if c.keep {
				what = "they stay held, as KeepLocksOnClose asks"
			}
			sd.add(fmt.Errorf("shutting down the lock service of owner %q: %w; its locks were not released: %s "+
				"(give Shutdown a longer context than %s, or end the calls in flight first)", c.owner, err, what, c.closeBudget))
			return
		}
		if c.keep {
			return
		}
		_, err := repo.DeleteAllOwned(c.closeCtx, c.owner)
		if err != nil && c.closeCtx.Err() != nil {
			err = fmt.Errorf("releasing the locks of owner %q on shutdown: the database did not answer before the shutdown's deadline (%s), "+
				"and they stay held until their TTL (give Shutdown a longer context to release them): %w", c.owner, c.closeBudget, err)
		}
		sd.add(err)
	}
	return c, release, nil
}
