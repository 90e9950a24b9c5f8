//go:build wireinject

package locks

import (
	"context"

	"github.com/google/wire"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/internal/backend"
)

// Every injector also uses newShutdown, provideService and newContainer.
// They are listed in each rather than in a wire.NewSet variable, which
// Wire would copy into wire_gen.go and so link package wire into every
// program that embeds the module.

func openSQLite(ctx context.Context, cfg Config) (*Container, func(), error) {
	wire.Build(
		newShutdown, provideService, newContainer,
		provideClock,
		provideSQLite,
		provideSQLiteWriter,
		provideSQLiteWakeups,
		sqlite.NewLockRepository,
		wire.Bind(new(application.LockRepository), new(*sqlite.LockRepository)),
	)
	return nil, nil, nil
}

// openBackend opens a store that its package registered, such as
// PostgreSQL's: the root package does not import it, so that a program
// that does not use it does not link it.
func openBackend(ctx context.Context, cfg Config, b backend.Backend) (*Container, func(), error) {
	wire.Build(
		newShutdown, provideService, newContainer,
		provideBackend,
		provideBackendRepository,
		provideBackendClock,
		provideBackendWakeups,
		provideNoWriter,
	)
	return nil, nil, nil
}

func openMemory(ctx context.Context, cfg Config) (*Container, func(), error) {
	wire.Build(
		newShutdown, provideService, newContainer,
		provideClock,
		provideMemory,
		provideNoWriter,
		provideNoWakeups,
		wire.Bind(new(application.LockRepository), new(*memory.LockRepository)),
	)
	return nil, nil, nil
}
