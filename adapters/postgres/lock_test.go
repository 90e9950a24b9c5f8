package postgres_test

import (
	"context"
	"database/sql"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/locktest"
	"github.com/cleveragents/locks/tests/testdb"
)

// MustOpenDB opens a store on a new schema and closes it when the test
// ends.
func MustOpenDB(tb testing.TB) *postgres.DB {
	tb.Helper()
	db, err := postgres.Open(context.Background(), testdb.Postgres(tb), postgres.Options{})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, db.Close()) })
	return db
}

func TestLockRepository_Contract(t *testing.T) {
	testdb.Postgres(t) // skip the whole suite at once without a server
	locktest.Run(t, func(t *testing.T) application.LockRepository {
		return postgres.NewLockRepository(MustOpenDB(t))
	})
}

func TestOpen_ConcurrentFirstOpen(t *testing.T) {
	dsn := testdb.Postgres(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
			if err == nil {
				err = db.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	var applied int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM locks_schema_version WHERE version_id > 0").Scan(&applied))
	versions, err := entstore.MigrationVersions(os.DirFS("migrations"))
	require.NoError(t, err)
	require.Equal(t, len(versions), applied, "each migration is recorded once")
}

// TestLockRepository_ContractInBatches holds the batch statements of group
// commit to the rules, state by state, as the suite above holds the lone
// ones: every write of the store goes through its batch statement.
func TestLockRepository_ContractInBatches(t *testing.T) {
	testdb.Postgres(t)
	locktest.Run(t, func(t *testing.T) application.LockRepository {
		return postgres.NewLockRepository(MustOpenDB(t)).InBatches()
	})
}

// TestLockRepository_ContractWithoutGroupCommit holds the store without
// its batches (Options.DisableGroupCommit) to the contract: every write
// its own statement.
func TestLockRepository_ContractWithoutGroupCommit(t *testing.T) {
	testdb.Postgres(t)
	locktest.Run(t, func(t *testing.T) application.LockRepository {
		db, err := postgres.Open(context.Background(), testdb.Postgres(t), postgres.Options{DisableGroupCommit: true})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		return postgres.NewLockRepository(db)
	})
}
