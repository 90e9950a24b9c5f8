//go:build wireinject

package locks

import (
	"context"

	"github.com/google/wire"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
)

var containerSet = wire.NewSet(newShutdown, provideService, newContainer)

func openSQLite(ctx context.Context, cfg Config) (*Container, func(), error) {
	wire.Build(
		containerSet,
		provideClock,
		provideSQLite,
		provideSQLiteWriter,
		provideSQLiteWakeups,
		sqlite.NewLockRepository,
		wire.Bind(new(application.LockRepository), new(*entstore.FreeFirstStore)),
	)
	return nil, nil, nil
}

func openPostgres(ctx context.Context, cfg Config) (*Container, func(), error) {
	wire.Build(
		containerSet,
		providePostgresClock,
		providePostgres,
		provideNoWriter,
		providePostgresWakeups,
		postgres.NewLockRepository,
		wire.Bind(new(application.LockRepository), new(*entstore.PostgresStore)),
	)
	return nil, nil, nil
}

func openMemory(ctx context.Context, cfg Config) (*Container, func(), error) {
	wire.Build(
		containerSet,
		provideClock,
		provideMemory,
		provideNoWriter,
		provideNoWakeups,
		wire.Bind(new(application.LockRepository), new(*memory.LockRepository)),
	)
	return nil, nil, nil
}
