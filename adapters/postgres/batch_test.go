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

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// The windows of group commit (entstore/batch.go), each with a batch in
// flight on purpose (testdb.Batches).

func newBatchFixture(t *testing.T) *testdb.Batches {
	t.Helper()
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	return &testdb.Batches{Store: postgres.NewLockRepository(db), Admin: admin}
}

var now = testdb.Now

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
	out := f.Acquires(t, background(16), owners, refs)
	f.Unblock()
	tokens := map[int64]bool{}
	for i, ch := range out {
		r := <-ch
		require.NoError(t, r.Err, "member %d", i)
		require.False(t, tokens[r.A.Lock.Token], "a token given twice")
		tokens[r.A.Lock.Token] = true
		require.Equal(t, owners[i], r.A.Lock.Owner)
		require.Equal(t, refs[i], r.A.Lock.Resource)
	}
	var txs int
	require.NoError(t, f.Admin.QueryRow("SELECT count(DISTINCT xmin::text) FROM locks").Scan(&txs))
	require.Equal(t, 1, txs, "the 16 locks were written by one transaction")
	require.Len(t, f.Rows(t), 16)
}

// A member whose row fails the statement (an owner longer than the
// column) fails alone: the others acquire, and nothing is written for it.
func TestGroupCommit_AFailingMemberFailsAlone(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(5)
	owners[2] = strings.Repeat("x", 300)
	out := f.Acquires(t, background(5), owners, refs)
	f.Unblock()
	for i, ch := range out {
		r := <-ch
		if i == 2 {
			var se *domain.StoreError
			require.ErrorAs(t, r.Err, &se, "the member with the bad owner learns of its own failure")
			continue
		}
		require.NoError(t, r.Err, "member %d", i)
		require.Equal(t, owners[i], r.A.Lock.Owner)
	}
	got := f.Rows(t)
	require.Len(t, got, 4)
	require.NotContains(t, got, "r2")
}

// A member whose resource another write holds (its advisory lock: an
// Update transaction, here a session of the test's) is left out of the
// batch: the others acquire at once, and it waits on its own.
func TestGroupCommit_ABusyMemberDelaysNoOne(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(4)
	hold, err := f.Admin.Conn(context.Background())
	require.NoError(t, err)
	defer hold.Close()
	_, err = hold.ExecContext(context.Background(), "SELECT pg_advisory_lock($1)", postgres.ResourceKey(refs[1]))
	require.NoError(t, err)
	out := f.Acquires(t, background(4), owners, refs)
	f.Unblock()
	for _, i := range []int{0, 2, 3} {
		select {
		case r := <-out[i]:
			require.NoError(t, r.Err, "member %d", i)
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
	require.NoError(t, r.Err)
	require.Equal(t, owners[1], r.A.Lock.Owner)
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
	out := f.Acquires(t, ctxs, owners, refs)
	leave()
	select {
	case r := <-out[1]:
		require.ErrorIs(t, r.Err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the caller that left waited for the batch")
	}
	require.Equal(t, 1, f.Waiting(t, "unnest"), "the batch goes on for the others")
	f.Unblock()
	for _, i := range []int{0, 2} {
		require.NoError(t, (<-out[i]).Err)
	}
	require.Eventually(t, func() bool {
		_, held := f.Rows(t)["r1"]
		return !held
	}, 10*time.Second, time.Millisecond, "the lock acquired for the caller that left stays")
	got := f.Rows(t)
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
	out := f.Acquires(t, ctxs, owners, refs)
	for i, cancel := range cancels {
		cancel()
		require.ErrorIs(t, (<-out[i]).Err, context.Canceled)
	}
	require.Eventually(t, func() bool { return f.Waiting(t, "unnest") == 0 },
		10*time.Second, time.Millisecond, "the statement of a batch that everyone left goes on")
	f.Unblock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := f.Store.AcquireAt(ctx, plan("after"), "after", now(time.Minute))
	require.NoError(t, err)
	got := f.Rows(t)
	require.Equal(t, map[string]string{"after": "after"}, got)
}

// A connection killed while its batch is in flight fails every member
// with the store's error, as each would have failed alone, and nothing
// of the batch is committed.
func TestGroupCommit_AKilledConnectionFailsEveryMember(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(4)
	out := f.Acquires(t, background(4), owners, refs)
	var killed bool
	require.NoError(t, f.Admin.QueryRow(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, 'unnest') > 0`).Scan(&killed))
	require.True(t, killed)
	for i, ch := range out {
		r := <-ch
		var se *domain.StoreError
		require.ErrorAs(t, r.Err, &se, "member %d: %v", i, r.Err)
		assert.Equal(t, domain.StoreUnreachable, se.Kind, "member %d: %v", i, r.Err)
	}
	f.Unblock()
	require.Empty(t, f.Rows(t))
	_, err := f.Store.AcquireAt(context.Background(), refs[0], owners[0], now(time.Minute))
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
		a, err := f.Store.AcquireAt(ctx, refs[i], owners[i], now(time.Minute))
		require.NoError(t, err)
		held[i] = a
	}
	f.BlockWrites(t)
	// The lone write that makes the others queue: a release by owner of a
	// resource no one holds.
	lone, cancelLone := context.WithCancel(ctx)
	loneDone := make(chan error, 1)
	go func() { _, err := f.Store.DeleteOwned(lone, plan("none"), "x"); loneDone <- err }()
	require.Eventually(t, func() bool { return f.Waiting(t, "DELETE") == 1 }, 10*time.Second, time.Millisecond)
	type outcome struct {
		ok  bool
		err error
	}
	rel := make([]chan outcome, 4)
	for i := range rel {
		rel[i] = make(chan outcome, 1)
	}
	go func() {
		ok, err := f.Store.DeleteToken(ctx, refs[0], held[0].Lock.Token, time.Now())
		rel[0] <- outcome{ok, err}
	}()
	go func() { ok, err := f.Store.DeleteOwned(ctx, refs[1], owners[1]); rel[1] <- outcome{ok, err} }()
	go func() {
		ok, err := f.Store.DeleteToken(ctx, refs[2], held[2].Lock.Token+100, time.Now())
		rel[2] <- outcome{ok, err}
	}()
	go func() { ok, err := f.Store.DeleteOwned(ctx, refs[3], "someone else"); rel[3] <- outcome{ok, err} }()
	require.Eventually(t, func() bool { return f.Store.Queued() == 4 }, 10*time.Second, time.Millisecond)
	cancelLone()
	require.ErrorIs(t, <-loneDone, context.Canceled)
	require.Eventually(t, func() bool { return f.Waiting(t, "unnest") == 1 }, 10*time.Second, time.Millisecond)
	f.Unblock()
	for i, want := range []bool{true, true, false, false} {
		o := <-rel[i]
		require.NoError(t, o.err)
		require.Equal(t, want, o.ok, "release %d", i)
	}
	got := f.Rows(t)
	require.Equal(t, map[string]string{"r2": "o2", "r3": "o3"}, got)
	_, err := f.Store.RenewTokenAt(ctx, refs[2], owners[2], held[2].Lock.Token, now(2*time.Minute))
	require.NoError(t, err)
	_, err = f.Store.RenewTokenAt(ctx, refs[3], owners[3], held[3].Lock.Token+100, now(2*time.Minute))
	require.True(t, errors.Is(err, application.ErrUndecided), "a stale token renews nothing: %v", err)
}

func plan(id string) domain.ResourceRef { return domain.ResourceRef{Type: domain.ResourcePlan, ID: id} }

// A release whose lock a fenced transaction holds (FOR KEY SHARE) waits
// for that transaction, as alone; the other releases of its batch do not.
func TestGroupCommit_AReleaseHeldByAFenceDelaysNoOne(t *testing.T) {
	f := newBatchFixture(t)
	ctx := context.Background()
	owners, refs := members(3)
	for i := range refs {
		_, err := f.Store.AcquireAt(ctx, refs[i], owners[i], now(time.Minute))
		require.NoError(t, err)
	}
	fence, err := f.Admin.Begin()
	require.NoError(t, err)
	defer fence.Rollback()
	_, err = fence.Exec("SELECT id FROM locks WHERE resource_id = 'r0' FOR KEY SHARE")
	require.NoError(t, err)

	f.BlockWrites(t)
	lone, cancelLone := context.WithCancel(ctx)
	loneDone := make(chan error, 1)
	go func() { _, err := f.Store.DeleteOwned(lone, plan("none"), "x"); loneDone <- err }()
	require.Eventually(t, func() bool { return f.Waiting(t, "DELETE") == 1 }, 10*time.Second, time.Millisecond)
	released := make([]chan error, 3)
	for i := range released {
		released[i] = make(chan error, 1)
		go func() {
			ok, err := f.Store.DeleteOwned(ctx, refs[i], owners[i])
			if err == nil && !ok {
				err = fmt.Errorf("the release of %s removed nothing", refs[i])
			}
			released[i] <- err
		}()
	}
	require.Eventually(t, func() bool { return f.Store.Queued() == 3 }, 10*time.Second, time.Millisecond)
	cancelLone()
	require.ErrorIs(t, <-loneDone, context.Canceled)
	require.Eventually(t, func() bool { return f.Waiting(t, "unnest") == 1 }, 10*time.Second, time.Millisecond)
	f.Unblock()
	for _, i := range []int{1, 2} {
		select {
		case err := <-released[i]:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("release %d waited for the fence on another resource", i)
		}
	}
	select {
	case err := <-released[0]:
		t.Fatalf("the release of the fenced lock did not wait for the fence: %v", err)
	default:
	}
	require.NoError(t, fence.Rollback())
	require.NoError(t, <-released[0])
	require.Empty(t, f.Rows(t))
}
