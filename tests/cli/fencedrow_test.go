//go:build unix

package cli

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_FencedTransactionPastItsExpiry: on PostgreSQL, a holder's
// fenced transaction holds its lock's row (FOR KEY SHARE) until it ends,
// also past the lock's expiry, and the lock does not change hands before.
// A command of another owner neither waits for it nor takes the lock: its
// open (the startup cleanup) skips the row, and acquire is refused at
// once (exit 3) with a message that says a transaction holds the row,
// where it used to wait until its deadline (exit 1).
func TestCLI_FencedTransactionPastItsExpiry(t *testing.T) {
	t.Parallel()
	a := newPGAgents(t)
	const deadline = 10 * time.Second
	a.env = append(a.env, "AGENTS_TIMEOUT="+deadline.String())
	a.mustRun("--owner", "holder", "locks", "acquire", "plan", "p1", "--ttl", "1h")

	db, err := sql.Open("pgx", a.db)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	// The lock expires (its expiry moved into the past, rather than waited
	// for) while the holder's fenced transaction holds its row.
	_, err = db.ExecContext(ctx, "UPDATE locks SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE resource_id = 'p1'")
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	var id int64
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT id FROM locks WHERE resource_id = 'p1' FOR KEY SHARE").Scan(&id))

	start := time.Now()
	r := a.run("--owner", "op", "--json", "locks", "acquire", "plan", "p1")
	took := time.Since(start)
	assert.Equal(t, 3, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	assert.Less(t, took, deadline, "the command waited for the fenced transaction")
	assert.Contains(t, r.stderr, `plan/p1 is held by another owner: "holder"`)
	assert.Contains(t, r.stderr, "a transaction that holds its row (the holder's fenced write) has not ended")
	var doc map[string]map[string]any
	r.decode(t, &doc)
	assert.Equal(t, "conflict", doc["error"]["code"])

	// Once the transaction has ended, the lock changes hands.
	require.NoError(t, tx.Rollback())
	a.mustRun("--owner", "op", "locks", "acquire", "plan", "p1")
	assert.Equal(t, map[string]string{"p1": "op"}, a.holders())
}
