package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Batches get a batch of PostgreSQL's group commit into flight on purpose,
// for the tests of its windows: the locks table is held in SHARE mode by a
// transaction of the test's, so that every write to it waits. Two pilot
// writes go first: one runs alone and waits; the second goes out as a
// batch of one, and waits too. The members queue behind that batch
// (Queued); the pilots' callers then leave, which lets the queue out
// beside the batch they left, and the members go out together, as one
// statement that waits for the table in its turn. The pilots' resources
// are named "pilot-..." and Rows leaves them out.
type Batches struct {
	Store *postgres.LockRepository
	// Admin reaches the store's database past the store.
	Admin *sql.DB
	// App, when set, is the application_name of the store's connections
	// (WithApp): Waiting then counts only their statements, not those of
	// other tests that share the database.
	App     string
	unblock func()
}

var apps atomic.Int64

// WithApp returns dsn, a postgres:// URL, with an application_name of its
// own, and that name, for Batches.App.
func WithApp(t *testing.T, dsn string) (string, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	app := fmt.Sprintf("locks-batches-%d-%d", os.Getpid(), apps.Add(1))
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String(), app
}

// Now gives an Op's At on the real clock, which the server's is close to.
func Now(ttl time.Duration) func() (time.Time, time.Time) {
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

// Waiting returns how many statements of the store (of App, when set)
// wait for a lock and contain part.
func (b *Batches) Waiting(t *testing.T, part string) int {
	var n int
	require.NoError(t, b.Admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0
  AND ($2 = '' OR application_name = $2)`, part, b.App).Scan(&n))
	return n
}

// Result is one member's outcome.
type Result struct {
	A   application.Outcome
	Err error
}

// HoldQueue blocks writes and sends the two pilots of a kind through
// pilot, which writes on the resource named id. It returns send, which
// waits until n members queue and then lets them out in one batch.
func (b *Batches) HoldQueue(t *testing.T, pilot func(ctx context.Context, id string) error) (send func(n int)) {
	t.Helper()
	b.BlockWrites(t)
	ctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 2)
	go func() { left <- pilot(ctx, "pilot-alone") }()
	require.Eventually(t, func() bool { return b.Waiting(t, "unnest") == 0 && b.Waiting(t, "") == 1 },
		30*time.Second, time.Millisecond, "the lone pilot never waited for the table")
	go func() { left <- pilot(ctx, "pilot-batch") }()
	require.Eventually(t, func() bool { return b.Waiting(t, "unnest") == 1 },
		30*time.Second, time.Millisecond, "the pilot batch never waited for the table")
	return func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return b.Store.Queued() == n },
			30*time.Second, time.Millisecond, "the members never queued")
		leave()
		require.ErrorIs(t, <-left, context.Canceled)
		require.ErrorIs(t, <-left, context.Canceled)
		require.Eventually(t, func() bool { return b.Waiting(t, "unnest") == 2 },
			30*time.Second, time.Millisecond, "the members' batch never waited for the table")
	}
}

// Acquires blocks writes and sends an acquire of each owners[i] on
// refs[i] in one batch, which then waits for the table; ctxs[i] is its
// caller's context. It returns the outcomes as they come.
func (b *Batches) Acquires(t *testing.T, ctxs []context.Context, owners []string, refs []domain.ResourceRef) []chan Result {
	t.Helper()
	send := b.HoldQueue(t, func(ctx context.Context, id string) error {
		_, err := b.Store.AcquireAt(ctx, domain.ResourceRef{Type: domain.ResourcePlan, ID: id}, "pilot", Now(time.Minute))
		return err
	})
	out := make([]chan Result, len(refs))
	for i := range refs {
		out[i] = make(chan Result, 1)
		go func() {
			a, err := b.Store.AcquireAt(ctxs[i], refs[i], owners[i], Now(time.Minute))
			out[i] <- Result{a, err}
		}()
	}
	send(len(refs))
	return out
}

// Rows returns the locks table but the pilots' rows: owner by resource id.
func (b *Batches) Rows(t *testing.T) map[string]string {
	t.Helper()
	rs, err := b.Admin.Query("SELECT resource_id, owner_id FROM locks WHERE resource_id NOT LIKE 'pilot-%'")
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
