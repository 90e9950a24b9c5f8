package entstore_test

import (
	"context"
	"database/sql"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/tests/testdb"
)

// TestBatchStatements_LookUpRowsThroughIndexes holds the batch statements
// to their promise (batchsql.go): each row is found through the
// resource's unique index or the primary key, even in a table that was
// never analyzed. The planner then takes the table for small and a scan
// for cheap, while the lock table's churn fills it with dead rows that a
// scan reads at every batch (12 % of the server's CPU in a profile of
// BenchmarkCycle at 32 callers).
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
	_, err = conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)

	param := regexp.MustCompile(`\$(\d+)`)
	for name, query := range entstore.BatchStatements() {
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
			lookups := plan.String()
			if name == "release" {
				// The rows that a release deletes, which it locked
				// through the primary key, are reached through their
				// physical addresses (ctid = ANY) or, where the planner
				// believes the table small, a scan: that is its choice
				// to make, with no lookup left in it.
				before, after, found := strings.Cut(lookups, "CTE d\n")
				require.True(t, found, "no DELETE in the release batch's plan:\n%s", lookups)
				_, after, found = strings.Cut(after, "CTE w\n")
				require.True(t, found, "no wake-ups in the release batch's plan:\n%s", lookups)
				lookups = before + after
			}
			require.NotRegexp(t, `Seq Scan on locks\b`, lookups, "a lookup of the plan scans the lock table:\n%s", plan.String())
		})
	}
}
