package locks_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// A program that does not import github.com/cleveragents/locks/adapters/postgres
// links no PostgreSQL code, and Open says so when it is given a
// PostgreSQL DSN; a URL of a database the module does not support is
// refused rather than taken for a file name. Both are validation errors:
// nothing is opened or created.
func ExampleOpen_databaseKinds() {
	ctx := context.Background()
	for _, database := range []string{"postgres://agents@db.internal/agents", "mysql://agents@db.internal/agents"} {
		_, err := locks.Open(ctx, locks.Config{Database: database})
		fmt.Println(errors.Is(err, domain.ErrValidation), err)
	}
	// Output:
	// true invalid database: names a PostgreSQL server, which this program cannot open: import github.com/cleveragents/locks/adapters/postgres to enable PostgreSQL
	// true invalid database: the mysql:// scheme is not supported: name a SQLite file (a path, or a "file:" URI), a PostgreSQL server (a "postgres://" or "postgresql://" URL, or "host=... dbname=..."; needs import _ "github.com/cleveragents/locks/adapters/postgres"), or ":memory:"
}
