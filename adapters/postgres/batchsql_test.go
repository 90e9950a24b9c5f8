package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// TestBatchStatements_LookUpRowsThroughIndexes holds the batch statements
// to their promise (batchsql.go): each row is found through the
// resource's unique index or the primary key, even in a table that was
// never analyzed, on the store's connections (enable_seqscan off, db.go).
// The planner then takes the table for small and a scan for cheap, while
// the lock table's churn fills it with dead rows that a scan reads at
// every batch (12 % of the server's CPU in a profile of BenchmarkCycle at
// 32 callers).
func TestBatchStatements_LookUpRowsThroughIndexes(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	pool, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer pool.Close()
	conn, err := pool.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	// As the store's own connections (db.go).
	for _, q := range []string{"SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off"} {
		_, err = conn.ExecContext(ctx, q)
		require.NoError(t, err)
	}

	param := regexp.MustCompile(`\$(\d+)`)
	for name, query := range postgres.BatchStatements() {
		t.Run(name, func(t *testing.T) {
			params := 0
			for _, m := range param.FindAllStringSubmatch(query, -1) {
				n, _ := strconv.Atoi(m[1])
				params = max(params, n)
			}
			_, err := conn.ExecContext(ctx, "PREPARE batch AS "+query)
			require.NoError(t, err)
			defer conn.ExecContext(ctx, "DEALLOCATE batch")
			rows, err := conn.QueryContext(ctx, "EXPLAIN EXECUTE batch("+strings.TrimSuffix(strings.Repeat("NULL, ", params), ", ")+")")
			require.NoError(t, err)
			var plan strings.Builder
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				plan.WriteString(line + "\n")
			}
			require.NoError(t, rows.Err())
			require.NotRegexp(t, `Seq Scan on locks\b`, plan.String(), "the plan scans the lock table")
		})
	}
}

// TestBatchStatements_ReleaseOfARowChangedMidStatement releases a lock in
// a batch whose statement began before the lock's owner renewed it: the
// statement reads the row as it was, and must still remove it as it is
// (READ COMMITTED: the DELETE follows the row to its newest version and
// decides again on it), never report that it was not there. The batch is
// large only so that its statement lasts long enough for the renewal to
// land between its snapshot and its lock on the row; the renewal is tried
// at several moments of it, since the snapshot comes after the server has
// read the arrays.
func TestBatchStatements_ReleaseOfARowChangedMidStatement(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	pool, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer pool.Close()

	const members = 200_000
	types, ids, owners, tokens, nows := make([]string, members), make([]string, members), make([]string, members),
		make([]int64, members), make([]string, members)
	for i := range members {
		types[i], ids[i], owners[i], nows[i] = "plan", fmt.Sprint("free-", i), "B", "2000-01-01T00:00:00.000000Z"
	}
	last := members - 1 // the member the statement reaches last, whatever its plan
	owners[last] = "A"
	// release runs the batch and returns whether it named the last member
	// (removed, not busy), and how long it took.
	release := func(ref domain.ResourceRef) (bool, time.Duration) {
		ids[last] = ref.ID
		began := time.Now()
		rows, err := pool.QueryContext(ctx, postgres.BatchStatements()["release"], types, ids, owners, tokens, nows)
		require.NoError(t, err)
		defer rows.Close()
		named := false
		for rows.Next() {
			var n int64
			var busy bool
			require.NoError(t, rows.Scan(&n, &busy))
			named = named || n == members && !busy
		}
		require.NoError(t, rows.Err())
		return named, time.Since(began)
	}
	ref := func(i int) domain.ResourceRef {
		return domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("renewed-", i)}
	}
	_, err = svc.Acquire(ctx, "A", ref(0), time.Minute)
	require.NoError(t, err)
	named, took := release(ref(0))
	require.True(t, named, "a release with no renewal")

	for i := 1; i <= 6; i++ {
		_, err = svc.Acquire(ctx, "A", ref(i), time.Minute)
		require.NoError(t, err)
		done := make(chan bool, 1)
		go func() {
			named, _ := release(ref(i))
			done <- named
		}()
		time.Sleep(took * time.Duration(i) / 8) // a moment of the statement, not a wait for time to pass
		_, renewErr := svc.Renew(ctx, "A", ref(i), 2*time.Minute)
		named := <-done
		_, getErr := svc.Get(ctx, ref(i))
		if renewErr != nil {
			require.True(t, named, "the batch removed the lock before the renewal, and said so")
			continue
		}
		require.True(t, named, "renewal at %d/8 of the statement: the batch says the lock was not there", i)
		require.ErrorIs(t, getErr, domain.ErrNotFound, "renewal at %d/8 of the statement: the lock the batch released is still there", i)
	}
}
