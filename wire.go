//go:build wireinject

package locks

import (
	"context"

	"github.com/google/wire"

	"github.com/cleveragents/locks/internal/backend"
)

// openStore opens the database that open opens (SQLite's, PostgreSQL's,
// memory's) and builds the container on it. The root package does not
// import PostgreSQL's adapter, which registers its open, so that a
// program that does not use it does not link it.
func openStore(ctx context.Context, cfg Config, open backend.Open) (*Container, func(), error) {
	wire.Build(
		newShutdown, provideService, newContainer,
		provideStore,
		provideRepository,
		provideClock,
		provideWakeups,
	)
	return nil, nil, nil
}
