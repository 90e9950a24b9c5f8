package main

import (
	"context"
	"fmt"

	"github.com/cleveragents/locks"
	_ "github.com/cleveragents/locks/adapters/postgres" // openModulePostgres opens a postgres:// DSN
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// module is the lock module as an application embeds it: one container
// (locks.Open) shared by all the callers of the process, each caller its
// own owner.
type module struct{ c *locks.Container }

func openModuleSQLite(ctx context.Context, env *environment) (instance, error) {
	return openModule(ctx, locks.Config{Database: env.file("module")})
}

func openModulePostgres(ctx context.Context, env *environment) (instance, error) {
	dsn, err := newSchema(ctx, env, "module")
	if err != nil {
		return nil, err
	}
	return openModule(ctx, locks.Config{Database: dsn})
}

func openModule(ctx context.Context, cfg locks.Config) (*module, error) {
	cfg.Owner = "bench-container"
	c, err := locks.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &module{c: c}, nil
}

func (m *module) close() error { return m.c.Close() }

// callers cycle with Acquire and Release on their own resources. On the
// shared resource they use the module's waiting acquire (Take with Wait,
// then Handle.Release): waiters are queued in arrival order and woken by
// the release, which is how the module is meant to be used under
// contention.
func (m *module) callers(_ context.Context, n int, shared bool) ([]cycleFunc, error) {
	opts := application.AcquireOptions{TTL: lockTTL, Wait: true}
	return perCaller(n, shared, func(ctx context.Context, owner, id string) error {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: id}
		if shared {
			h, err := m.c.Locks.Take(ctx, owner, ref, opts)
			if err != nil {
				return err
			}
			return released(h.Release(ctx))
		}
		if _, err := m.c.Locks.Acquire(ctx, owner, ref, lockTTL); err != nil {
			return err
		}
		return released(m.c.Locks.Release(ctx, owner, ref))
	}), nil
}

// released turns a release that removed nothing into an error: every
// cycle releases a lock its caller holds.
func released(ok bool, err error) error {
	if err == nil && !ok {
		return fmt.Errorf("the release removed no lock")
	}
	return err
}
