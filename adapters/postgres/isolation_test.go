package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// roleWithIsolation creates a scratch role whose transactions default to
// isolation level isolation, and that may use the (migrated) store in the
// schema of dsn; it returns dsn for that role.
func roleWithIsolation(t *testing.T, dsn, isolation string) string {
	t.Helper()
	role := scratchRole(t, dsn)
	schema := pgx.Identifier{schemaOf(t, dsn)}.Sanitize()
	adminExec(t, dsn, "ALTER ROLE "+role+" SET default_transaction_isolation = '"+isolation+"'")
	adminExec(t, dsn, "GRANT USAGE ON SCHEMA "+schema+" TO "+role)
	adminExec(t, dsn, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+schema+" TO "+role)
	adminExec(t, dsn, "GRANT USAGE ON ALL SEQUENCES IN SCHEMA "+schema+" TO "+role)
	return asUser(t, dsn, role)
}

func TestOpen_IsolationPinned(t *testing.T) {
	for _, isolation := range []string{"serializable", "repeatable read"} {
		t.Run(isolation, func(t *testing.T) {
			dsn := testdb.Postgres(t)
			mustOpen(t, dsn) // migrate as the schema's owner
			roleDSN := roleWithIsolation(t, dsn, isolation)

			// The role's default holds on a plain connection...
			raw := rawPG(t, roleDSN)
			var level string
			require.NoError(t, raw.QueryRow("SELECT current_setting('transaction_isolation')").Scan(&level))
			require.Equal(t, isolation, level, "the scratch role's default")

			db, err := postgres.Open(context.Background(), roleDSN, postgres.Options{})
			require.NoError(t, err)
			defer db.Close()
			// ...but not on the store's: every statement, in a transaction
			// or not, runs at READ COMMITTED.
			assert.Equal(t, "read committed", postgres.SessionIsolation(t, db))

			// Owners contend for one resource through the service: a
			// refusal is a conflict, never a store failure.
			svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0)
			require.NoError(t, err)
			ctx := context.Background()
			start := time.Now()
			var (
				mu        sync.Mutex
				acquired  int
				conflicts int
				failures  []error
			)
			// Two seconds at least, and until the owners have both taken
			// the lock and met one another, however slowly a loaded
			// machine lets them: at most a minute.
			more := func() bool {
				mu.Lock()
				defer mu.Unlock()
				ran := time.Since(start)
				return ran < 2*time.Second || (ran < time.Minute && (acquired == 0 || conflicts == 0))
			}
			var wg sync.WaitGroup
			for i := range 8 {
				owner := fmt.Sprint("owner-", i)
				wg.Go(func() {
					for more() {
						_, err := svc.Acquire(ctx, owner, plan1, 0)
						if err == nil {
							_, err = svc.Release(ctx, owner, plan1)
						}
						var conflict *domain.LockConflictError
						mu.Lock()
						switch {
						case err == nil:
							acquired++
						case errors.As(err, &conflict):
							conflicts++
						default:
							failures = append(failures, err)
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			t.Logf("%d acquired and released, %d conflicts, %d other errors", acquired, conflicts, len(failures))
			for i, err := range failures {
				if i == 5 {
					break
				}
				t.Errorf("not a conflict: %v", err)
			}
			assert.Zero(t, len(failures), "errors other than conflicts")
			assert.Positive(t, acquired)
			assert.Positive(t, conflicts, "the owners did contend")
		})
	}
}
