package testdb

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Batches get a batch of PostgreSQL's group commit into flight on purpose,
// for the tests of its windows: the locks table is held in SHARE mode by a
// transaction of the test's, so that every write to it waits; a lone
// acquire goes first and waits; the members queue behind it (Queued); the
// lone acquire is then cancelled, and the members go out together, as one
// statement that waits for the table in its turn.
type Batches struct {
	Store *entstore.PostgresStore
	// Admin reaches the store's database past the store.
	Admin   *sql.DB
	unblock func()
}

// Now is a Timing on the real clock, which the server's is close to.
func Now(ttl time.Duration) application.Timing {
	return func() (time.Time, time.Time) {
		n := time.Now().UTC().Truncate(time.Microsecond)
		return n, n.Add(ttl)
	}
}

// BlockWrites holds the locks table in SHARE mode until Unblock.
func (b *Batches) BlockWrites(t *testing.T) {
	t.Helper()
	tx, err := b.Admin.Begin()
	require.NoError(t, err)
	_, err = tx.Exec("LOCK TABLE locks IN SHARE MODE")
	require.NoError(t, err)
	done := false
	b.unblock = func() {
		if !done {
			done = true
			_ = tx.Rollback() // fails only if the server ended it
		}
	}
	t.Cleanup(b.unblock)
}

// Unblock ends the transaction of BlockWrites.
func (b *Batches) Unblock() { b.unblock() }

// Waiting returns how many statements wait for a lock whose text contains
// part.
func (b *Batches) Waiting(t *testing.T, part string) int {
	var n int
	require.NoError(t, b.Admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, part).Scan(&n))
	return n
}

// Result is one member's outcome.
type Result struct {
	A   application.Acquisition
	Err error
}

// Acquires blocks writes and sends an acquire of each owners[i] on
// refs[i] in one batch, which then waits for the table; ctxs[i] is its
// caller's context. It returns the outcomes as they come.
func (b *Batches) Acquires(t *testing.T, ctxs []context.Context, owners []string, refs []domain.ResourceRef) []chan Result {
	t.Helper()
	b.BlockWrites(t)
	lone, cancelLone := context.WithCancel(context.Background())
	loneDone := make(chan error, 1)
	go func() {
		_, err := b.Store.AcquireAt(lone, domain.ResourceRef{Type: domain.ResourcePlan, ID: "lone"}, "lone", Now(time.Minute))
		loneDone <- err
	}()
	require.Eventually(t, func() bool { return b.Waiting(t, "pg_advisory_xact_lock") == 1 },
		30*time.Second, time.Millisecond, "the lone acquire never waited for the table")
	out := make([]chan Result, len(refs))
	for i := range refs {
		out[i] = make(chan Result, 1)
		go func() {
			a, err := b.Store.AcquireAt(ctxs[i], refs[i], owners[i], Now(time.Minute))
			out[i] <- Result{a, err}
		}()
	}
	require.Eventually(t, func() bool { return b.Store.Queued() == len(refs) },
		30*time.Second, time.Millisecond, "the members never queued")
	cancelLone()
	require.ErrorIs(t, <-loneDone, context.Canceled)
	require.Eventually(t, func() bool { return b.Waiting(t, "unnest") == 1 },
		30*time.Second, time.Millisecond, "the batch never waited for the table")
	return out
}

// Rows returns the locks table: owner by resource id.
func (b *Batches) Rows(t *testing.T) map[string]string {
	t.Helper()
	rs, err := b.Admin.Query("SELECT resource_id, owner_id FROM locks")
	require.NoError(t, err)
	defer rs.Close()
	got := map[string]string{}
	for rs.Next() {
		var id, owner string
		require.NoError(t, rs.Scan(&id, &owner))
		got[id] = owner
	}
	require.NoError(t, rs.Err())
	return got
}
