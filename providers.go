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

// provideService builds the lock service with its ports. Its cleanup
// unregisters the metrics' callback, after the container's has closed the
// service.
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
	// The active-locks gauge asks the service, which does not exist yet.
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

// provideStore opens the database; its cleanup closes it, after the container's has released the locks.
func provideStore(ctx context.Context, cfg Config, open backend.Open, sd *shutdown) (backend.Store, func(), error) {
	// A clock the test moves implies LocalTime: it cannot move the server's.
	_, mock := cfg.Clock.(interface {
		Add(time.Duration)
		Set(time.Time)
	})
	opts := backend.Options{Database: cfg.Database, Clock: cfg.Clock, LocalTime: cfg.LocalTime || mock, BusyTimeout: cfg.BusyTimeout}
	if !cfg.ShareOwner {
		opts.Owner = cfg.Owner
	}
	s, err := open(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	return s, func() { sd.add(s.Close(sd.ctx)) }, nil
}

func provideRepository(s backend.Store) application.LockRepository { return s.Repository() }
func provideClock(s backend.Store) application.Clock               { return s.Clock() }
func provideWakeups(s backend.Store) application.Wakeups           { return s.Wakeups() }

// newContainer runs the startup cleanup and starts the periodic one. Its
// cleanup stops the periodic one, closes the service, letting the calls in
// flight finish, and only then releases the owner's locks through the
// repository, so that nothing the service admitted commits after that.
func newContainer(ctx context.Context, svc *application.LockService, s backend.Store, repo application.LockRepository, clk application.Clock,
	cfg Config, sd *shutdown) (*Container, func(), error) {
	c := &Container{Locks: svc, owner: cfg.Owner, clock: clk, store: s, shutdown: sd, write: s.Writer()}
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
		if err := svc.Close(sd.ctx); err != nil {
			// A call still in flight could commit a lock after a release.
			what := "they stay held until their TTL, or until released elsewhere"
			if cfg.KeepLocksOnClose {
				what = "they stay held, as KeepLocksOnClose asks"
			}
			sd.add(fmt.Errorf("shutting down the lock service of owner %q: %w; its locks were not released: %s "+
				"(give Shutdown a longer context than %s, or end the calls in flight first)", c.owner, err, what, sd.budget))
			return
		}
		if cfg.KeepLocksOnClose {
			return
		}
		_, err := repo.DeleteAllOwned(sd.ctx, c.owner)
		if err != nil && sd.ctx.Err() != nil {
			err = fmt.Errorf("releasing the locks of owner %q on shutdown: the database did not answer before the shutdown's deadline (%s), "+
				"and they stay held until their TTL (give Shutdown a longer context to release them): %w", c.owner, sd.budget, err)
		}
		sd.add(err)
	}
	return c, release, nil
}
