package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// The windows of group commit (entstore/batch.go). Each test gets a batch
// into flight on purpose: the locks table is held in SHARE mode by a
// transaction of the test's (blockWrites), so that every write to it
// waits; a lone acquire goes first and waits; the members queue behind it
// (Queued); the lone acquire is then cancelled, and the members go out
// together, as one statement that waits for the table in its turn.

// batchFixture is a store, its database seen by an administrator, and
// the table held.
type batchFixture struct {
	store *entstore.PostgresStore
	admin *sql.DB
	// unblock ends the transaction that holds the table (once).
	unblock func()
}

func newBatchFixture(t *testing.T) *batchFixture {
	t.Helper()
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	return &batchFixture{store: postgres.NewLockRepository(db), admin: admin}
}

// now is a Timing on the real clock, which the server's is close to.
func now(ttl time.Duration) application.Timing {
	return func() (time.Time, time.Time) {
		n := time.Now().UTC().Truncate(time.Microsecond)
		return n, n.Add(ttl)
	}
}

// blockWrites holds the locks table in SHARE mode until f.unblock.
func (f *batchFixture) blockWrites(t *testing.T) {
	t.Helper()
	tx, err := f.admin.Begin()
	require.NoError(t, err)
	_, err = tx.Exec("LOCK TABLE locks IN SHARE MODE")
	require.NoError(t, err)
	done := false
	f.unblock = func() {
		if !done {
			done = true
			require.NoError(t, tx.Rollback())
		}
	}
	t.Cleanup(f.unblock)
}

// waiting returns how many statements wait for a lock whose text contains
// part.
func (f *batchFixture) waiting(t *testing.T, part string) int {
	var n int
	require.NoError(t, f.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, part).Scan(&n))
	return n
}

// result is one member's outcome.
type result struct {
	a   application.Acquisition
	err error
}

// acquireInBatch sends an acquire of each owners[i] on refs[i] in one
// batch, which then waits for the table; ctxs[i] is its caller's
// context. It returns the outcomes as they come.
func (f *batchFixture) acquireInBatch(t *testing.T, ctxs []context.Context, owners []string, refs []domain.ResourceRef) []chan result {
	t.Helper()
	f.blockWrites(t)
	lone, cancelLone := context.WithCancel(context.Background())
	loneDone := make(chan error, 1)
	go func() {
		_, err := f.store.AcquireAt(lone, plan("lone"), "lone", now(time.Minute))
		loneDone <- err
	}()
	require.Eventually(t, func() bool { return f.waiting(t, "pg_advisory_xact_lock") == 1 },
		10*time.Second, time.Millisecond, "the lone acquire never waited for the table")
	out := make([]chan result, len(refs))
	for i := range refs {
		out[i] = make(chan result, 1)
		go func() {
			a, err := f.store.AcquireAt(ctxs[i], refs[i], owners[i], now(time.Minute))
			out[i] <- result{a, err}
		}()
	}
	require.Eventually(t, func() bool { return f.store.Queued() == len(refs) },
		10*time.Second, time.Millisecond, "the members never queued")
	cancelLone()
	require.ErrorIs(t, <-loneDone, context.Canceled)
	require.Eventually(t, func() bool { return f.waiting(t, "unnest") == 1 },
		10*time.Second, time.Millisecond, "the batch never waited for the table")
	return out
}

// rows returns the locks table: owner by resource id.
func (f *batchFixture) rows(t *testing.T) map[string]string {
	t.Helper()
	rs, err := f.admin.Query("SELECT resource_id, owner_id FROM locks")
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

func background(n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = context.Background()
	}
	return ctxs
}

func members(n int) ([]string, []domain.ResourceRef) {
	owners, refs := make([]string, n), make([]domain.ResourceRef, n)
	for i := range owners {
		owners[i], refs[i] = fmt.Sprintf("o%d", i), plan(fmt.Sprintf("r%d", i))
	}
	return owners, refs
}

func TestGroupCommit_OneStatementAndOneCommitForMany(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(16)
	out := f.acquireInBatch(t, background(16), owners, refs)
	f.unblock()
	tokens := map[int64]bool{}
	for i, ch := range out {
		r := <-ch
		require.NoError(t, r.err, "member %d", i)
		require.False(t, tokens[r.a.Lock.Token], "a token given twice")
		tokens[r.a.Lock.Token] = true
		require.Equal(t, owners[i], r.a.Lock.Owner)
		require.Equal(t, refs[i], r.a.Lock.Resource)
	}
	var txs int
	require.NoError(t, f.admin.QueryRow("SELECT count(DISTINCT xmin::text) FROM locks").Scan(&txs))
	require.Equal(t, 1, txs, "the 16 locks were written by one transaction")
	require.Len(t, f.rows(t), 16)
}

// A member whose row fails the statement (an owner longer than the
// column) fails alone: the others acquire, and nothing is written for it.
func TestGroupCommit_AFailingMemberFailsAlone(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(5)
	owners[2] = strings.Repeat("x", 300)
	out := f.acquireInBatch(t, background(5), owners, refs)
	f.unblock()
	for i, ch := range out {
		r := <-ch
		if i == 2 {
			var se *domain.StoreError
			require.ErrorAs(t, r.err, &se, "the member with the bad owner learns of its own failure")
			continue
		}
		require.NoError(t, r.err, "member %d", i)
		require.Equal(t, owners[i], r.a.Lock.Owner)
	}
	got := f.rows(t)
	require.Len(t, got, 4)
	require.NotContains(t, got, "r2")
}

// A member whose resource another write holds (its advisory lock: an
// Update transaction, here a session of the test's) is left out of the
// batch: the others acquire at once, and it waits on its own.
func TestGroupCommit_ABusyMemberDelaysNoOne(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(4)
	hold, err := f.admin.Conn(context.Background())
	require.NoError(t, err)
	defer hold.Close()
	_, err = hold.ExecContext(context.Background(), "SELECT pg_advisory_lock($1)", postgres.ResourceKey(refs[1]))
	require.NoError(t, err)
	out := f.acquireInBatch(t, background(4), owners, refs)
	f.unblock()
	for _, i := range []int{0, 2, 3} {
		select {
		case r := <-out[i]:
			require.NoError(t, r.err, "member %d", i)
		case <-time.After(10 * time.Second):
			t.Fatalf("member %d waited for the busy member's resource", i)
		}
	}
	select {
	case r := <-out[1]:
		t.Fatalf("the busy member returned while its resource was held: %+v", r)
	default:
	}
	_, err = hold.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", postgres.ResourceKey(refs[1]))
	require.NoError(t, err)
	r := <-out[1]
	require.NoError(t, r.err)
	require.Equal(t, owners[1], r.a.Lock.Owner)
}

// A caller whose context ends while its batch is in flight returns at
// once; the lock the batch then acquired for it is released, and the
// others keep theirs.
func TestGroupCommit_ACallerThatLeavesInFlightHoldsNothing(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(3)
	ctxs := background(3)
	leaving, leave := context.WithCancel(context.Background())
	ctxs[1] = leaving
	out := f.acquireInBatch(t, ctxs, owners, refs)
	leave()
	select {
	case r := <-out[1]:
		require.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the caller that left waited for the batch")
	}
	require.Equal(t, 1, f.waiting(t, "unnest"), "the batch goes on for the others")
	f.unblock()
	for _, i := range []int{0, 2} {
		require.NoError(t, (<-out[i]).err)
	}
	require.Eventually(t, func() bool {
		_, held := f.rows(t)["r1"]
		return !held
	}, 10*time.Second, time.Millisecond, "the lock acquired for the caller that left stays")
	got := f.rows(t)
	require.Equal(t, "o0", got["r0"])
	require.Equal(t, "o2", got["r2"])
}

// When every caller of a batch has left, its statement is cancelled:
// nothing is written, and the next write goes out at once.
func TestGroupCommit_ABatchEveryoneLeftIsCancelled(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(3)
	ctxs := make([]context.Context, 3)
	cancels := make([]context.CancelFunc, 3)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
	}
	out := f.acquireInBatch(t, ctxs, owners, refs)
	for i, cancel := range cancels {
		cancel()
		require.ErrorIs(t, (<-out[i]).err, context.Canceled)
	}
	require.Eventually(t, func() bool { return f.waiting(t, "unnest") == 0 },
		10*time.Second, time.Millisecond, "the statement of a batch that everyone left goes on")
	f.unblock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := f.store.AcquireAt(ctx, plan("after"), "after", now(time.Minute))
	require.NoError(t, err)
	got := f.rows(t)
	require.Equal(t, map[string]string{"after": "after"}, got)
}

// A connection killed while its batch is in flight fails every member
// with the store's error, as each would have failed alone, and nothing
// of the batch is committed.
func TestGroupCommit_AKilledConnectionFailsEveryMember(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(4)
	out := f.acquireInBatch(t, background(4), owners, refs)
	var killed bool
	require.NoError(t, f.admin.QueryRow(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, 'unnest') > 0`).Scan(&killed))
	require.True(t, killed)
	for i, ch := range out {
		r := <-ch
		var se *domain.StoreError
		require.ErrorAs(t, r.err, &se, "member %d: %v", i, r.err)
		assert.Equal(t, domain.StoreUnreachable, se.Kind, "member %d: %v", i, r.err)
	}
	f.unblock()
	require.Empty(t, f.rows(t))
	_, err := f.store.AcquireAt(context.Background(), refs[0], owners[0], now(time.Minute))
	require.NoError(t, err, "the store works on after the kill")
}

// Releases and renewals share batches too, each member decided by its own
// rule: by token, active; by owner; a stale token removes nothing.
func TestGroupCommit_ReleasesAndRenewals(t *testing.T) {
	f := newBatchFixture(t)
	ctx := context.Background()
	owners, refs := members(4)
	held := make([]application.Acquisition, 4)
	for i := range refs {
		a, err := f.store.AcquireAt(ctx, refs[i], owners[i], now(time.Minute))
		require.NoError(t, err)
		held[i] = a
	}
	f.blockWrites(t)
	// The lone write that makes the others queue: a release by owner of a
	// resource no one holds.
	lone, cancelLone := context.WithCancel(ctx)
	loneDone := make(chan error, 1)
	go func() { _, err := f.store.DeleteOwned(lone, plan("none"), "x"); loneDone <- err }()
	require.Eventually(t, func() bool { return f.waiting(t, "DELETE") == 1 }, 10*time.Second, time.Millisecond)
	type outcome struct {
		ok  bool
		err error
	}
	rel := make([]chan outcome, 4)
	for i := range rel {
		rel[i] = make(chan outcome, 1)
	}
	go func() {
		ok, err := f.store.DeleteToken(ctx, refs[0], held[0].Lock.Token, time.Now())
		rel[0] <- outcome{ok, err}
	}()
	go func() { ok, err := f.store.DeleteOwned(ctx, refs[1], owners[1]); rel[1] <- outcome{ok, err} }()
	go func() {
		ok, err := f.store.DeleteToken(ctx, refs[2], held[2].Lock.Token+100, time.Now())
		rel[2] <- outcome{ok, err}
	}()
	go func() { ok, err := f.store.DeleteOwned(ctx, refs[3], "someone else"); rel[3] <- outcome{ok, err} }()
	require.Eventually(t, func() bool { return f.store.Queued() == 4 }, 10*time.Second, time.Millisecond)
	cancelLone()
	require.ErrorIs(t, <-loneDone, context.Canceled)
	require.Eventually(t, func() bool { return f.waiting(t, "unnest") == 1 }, 10*time.Second, time.Millisecond)
	f.unblock()
	for i, want := range []bool{true, true, false, false} {
		o := <-rel[i]
		require.NoError(t, o.err)
		require.Equal(t, want, o.ok, "release %d", i)
	}
	got := f.rows(t)
	require.Equal(t, map[string]string{"r2": "o2", "r3": "o3"}, got)
	_, err := f.store.RenewTokenAt(ctx, refs[2], owners[2], held[2].Lock.Token, now(2*time.Minute))
	require.NoError(t, err)
	_, err = f.store.RenewTokenAt(ctx, refs[3], owners[3], held[3].Lock.Token+100, now(2*time.Minute))
	require.True(t, errors.Is(err, application.ErrUndecided), "a stale token renews nothing: %v", err)
}

func plan(id string) domain.ResourceRef { return domain.ResourceRef{Type: domain.ResourcePlan, ID: id} }
