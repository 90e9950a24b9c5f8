package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// The windows of group commit (batch.go), each with a batch in
// flight on purpose (testdb.Batches).

func newBatchFixture(t *testing.T) *testdb.Batches {
	t.Helper()
	dsn := testdb.Postgres(t)
	storeDSN, app := testdb.WithApp(t, dsn)
	db, err := postgres.Open(context.Background(), storeDSN, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	return &testdb.Batches{Store: postgres.NewLockRepository(db), Admin: admin, App: app}
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
	require.NoError(t, f.Admin.QueryRow("SELECT count(DISTINCT xmin::text) FROM locks WHERE resource_id NOT LIKE 'pilot-%'").Scan(&txs))
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
	require.Equal(t, 2, f.Waiting(t, "unnest"), "the batch goes on for the others (beside the pilots')")
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

// When every caller of a batch has left, the batch goes on to its answer,
// and then releases what it acquired for them; the queue does not wait
// for it meanwhile.
func TestGroupCommit_ABatchEveryoneLeftHoldsNothing(t *testing.T) {
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
	// The next write goes out beside the batch everyone left: it waits for
	// the table too, not for that batch.
	after := make(chan error, 1)
	go func() {
		_, err := f.Store.AcquireAt(context.Background(), plan("after"), "after", now(time.Minute))
		after <- err
	}()
	require.Eventually(t, func() bool { return f.Waiting(t, "") == 3 }, 10*time.Second, time.Millisecond,
		"the next write waited for the batch everyone left")
	sent := f.Store.WriteStats().Statements // the batch's is counted at its answer
	f.Unblock()
	require.NoError(t, <-after)
	// The next write may commit before the batch does: the batch's locks
	// are gone only once it has answered.
	require.Eventually(t, func() bool {
		return f.Store.WriteStats().Statements > sent && len(f.Rows(t)) == 1
	}, 10*time.Second, time.Millisecond, "the locks acquired for callers that had left stay: %v", f.Rows(t))
	require.Equal(t, map[string]string{"after": "after"}, f.Rows(t))
}

// A connection killed while its batch is in flight fails every member
// with the store's error, as each would have failed alone, and nothing
// of the batch is committed.
func TestGroupCommit_AKilledConnectionFailsEveryMember(t *testing.T) {
	f := newBatchFixture(t)
	owners, refs := members(4)
	out := f.Acquires(t, background(4), owners, refs)
	var killed bool
	// The members' batch, not the pilot's before it: a batch that its
	// caller left and that fails has an outcome no one knows, which Close
	// reports.
	require.NoError(t, f.Admin.QueryRow(`SELECT pg_terminate_backend(pid) FROM (SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, 'unnest') > 0
  AND application_name = $1 ORDER BY query_start DESC LIMIT 1) AS members`, f.App).Scan(&killed))
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
	held := make([]application.Outcome, 4)
	for i := range refs {
		a, err := f.Store.AcquireAt(ctx, refs[i], owners[i], now(time.Minute))
		require.NoError(t, err)
		held[i] = a
	}
	// The pilots that make the others queue: releases by owner of
	// resources no one holds.
	send := f.HoldQueue(t, func(ctx context.Context, id string) error {
		_, err := f.Store.DeleteOwned(ctx, plan(id), "x")
		return err
	})
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
	send(4)
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
	out, err := f.Store.RenewTokenAt(ctx, refs[3], owners[3], held[3].Lock.Token+100, now(2*time.Minute))
	require.NoError(t, err)
	require.Equal(t, application.ChangeNone, out.Kind, "a stale token renews nothing")
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

	// The pilots that make the others queue: releases by owner of
	// resources no one holds.
	send := f.HoldQueue(t, func(ctx context.Context, id string) error {
		_, err := f.Store.DeleteOwned(ctx, plan(id), "x")
		return err
	})
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
	send(3)
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

// A lone write that waits (for a resource's advisory lock, which another
// process's transaction holds, or for a fenced row) holds up no later
// write of its kind on another resource: those go out in batches, which
// never wait.
func TestGroupCommit_AWaitingWriteHoldsUpNoOther(t *testing.T) {
	prompt := func(t *testing.T, what string, call func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		require.NoError(t, call(ctx), "%s behind a waiting write of its kind (after %v)", what, time.Since(start))
	}
	holdKey := func(t *testing.T, f *testdb.Batches, ref domain.ResourceRef) func() {
		conn, err := f.Admin.Conn(context.Background())
		require.NoError(t, err)
		_, err = conn.ExecContext(context.Background(), "SELECT pg_advisory_lock($1)", postgres.ResourceKey(ref))
		require.NoError(t, err)
		var once sync.Once
		unhold := func() {
			once.Do(func() {
				_, err := conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", postgres.ResourceKey(ref))
				assert.NoError(t, err)
				conn.Close()
			})
		}
		t.Cleanup(unhold)
		return unhold
	}
	t.Run("Acquire", func(t *testing.T) {
		f := newBatchFixture(t)
		unhold := holdKey(t, f, plan("R"))
		waiting := make(chan error, 1)
		go func() {
			_, err := f.Store.AcquireAt(context.Background(), plan("R"), "a", now(time.Minute))
			waiting <- err
		}()
		require.Eventually(t, func() bool { return f.Waiting(t, "pg_advisory_xact_lock") == 1 }, 10*time.Second, time.Millisecond)
		prompt(t, "an acquire of a free resource", func(ctx context.Context) error {
			_, err := f.Store.AcquireAt(ctx, plan("S"), "b", now(time.Minute))
			return err
		})
		unhold()
		require.NoError(t, <-waiting)
	})
	t.Run("Renew", func(t *testing.T) {
		f := newBatchFixture(t)
		ctx := context.Background()
		r, err := f.Store.AcquireAt(ctx, plan("R"), "a", now(time.Minute))
		require.NoError(t, err)
		s, err := f.Store.AcquireAt(ctx, plan("S"), "b", now(time.Minute))
		require.NoError(t, err)
		unhold := holdKey(t, f, plan("R"))
		waiting := make(chan error, 1)
		go func() {
			_, err := f.Store.RenewTokenAt(ctx, plan("R"), "a", r.Lock.Token, now(time.Minute))
			waiting <- err
		}()
		require.Eventually(t, func() bool { return f.Waiting(t, "pg_advisory_xact_lock") == 1 }, 10*time.Second, time.Millisecond)
		prompt(t, "a renewal of another lock", func(ctx context.Context) error {
			_, err := f.Store.RenewTokenAt(ctx, plan("S"), "b", s.Lock.Token, now(time.Minute))
			return err
		})
		unhold()
		require.NoError(t, <-waiting)
	})
	t.Run("ReleaseWhileItsOwnFenceIsOpen", func(t *testing.T) {
		// A worker's fenced transaction on R releases the worker's other
		// lock, S, before it commits, while another goroutine's release of
		// R waits for that commit: S must not wait for R.
		f := newBatchFixture(t)
		ctx := context.Background()
		r, err := f.Store.AcquireAt(ctx, plan("R"), "w", now(time.Minute))
		require.NoError(t, err)
		s, err := f.Store.AcquireAt(ctx, plan("S"), "w", now(time.Minute))
		require.NoError(t, err)
		fence, err := f.Admin.Begin()
		require.NoError(t, err)
		t.Cleanup(func() { fence.Rollback() })
		_, err = fence.Exec("SELECT id FROM locks WHERE resource_id = 'R' FOR KEY SHARE")
		require.NoError(t, err)
		waiting := make(chan error, 1)
		go func() { _, err := f.Store.DeleteToken(ctx, plan("R"), r.Lock.Token, time.Now()); waiting <- err }()
		require.Eventually(t, func() bool { return f.Waiting(t, "DELETE") == 1 }, 10*time.Second, time.Millisecond)
		prompt(t, "the worker's release of its other lock", func(ctx context.Context) error {
			ok, err := f.Store.DeleteToken(ctx, plan("S"), s.Lock.Token, time.Now())
			if err == nil && !ok {
				err = errors.New("removed nothing")
			}
			return err
		})
		require.NoError(t, fence.Commit())
		require.NoError(t, <-waiting)
	})
}

// slowProxy forwards TCP to target; once slow is set, it holds every
// chunk from the server for delay before passing it on: an answer that
// crawls back after the server has committed.
type slowProxy struct {
	ln    net.Listener
	slow  atomic.Bool
	delay time.Duration
}

func newSlowProxy(t *testing.T, target string, delay time.Duration) *slowProxy {
	p := &slowProxy{delay: delay}
	p.ln = newProxy(t, target, func(c, s net.Conn) {
		go func() { io.Copy(s, c); s.Close() }()
		forward(c, s, func([]byte) bool {
			if p.slow.Load() {
				time.Sleep(p.delay)
			}
			return true
		})
		c.Close()
	})
	return p
}

// Every caller of a batch leaves after the server committed it, while
// its answer is still on the way: the locks it acquired for them are
// released, by their tokens, as for a caller that leaves alone.
func TestGroupCommit_ABatchEveryoneLeftAfterItsCommitHoldsNothing(t *testing.T) {
	dsn := testdb.Postgres(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	px := newSlowProxy(t, u.Host, 2*time.Second)
	u.Host = px.ln.Addr().String()
	storeDSN, app := testdb.WithApp(t, u.String())
	db, err := postgres.Open(context.Background(), storeDSN, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	f := &testdb.Batches{Store: postgres.NewLockRepository(db), Admin: admin, App: app}

	owners, refs := members(3)
	ctxs := make([]context.Context, 3)
	cancels := make([]context.CancelFunc, 3)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
	}
	out := f.Acquires(t, ctxs, owners, refs)
	px.slow.Store(true)
	f.Unblock()
	require.Eventually(t, func() bool { return len(f.Rows(t)) == 3 }, 10*time.Second, time.Millisecond,
		"the batch never committed")
	for i, cancel := range cancels {
		cancel()
		require.ErrorIs(t, (<-out[i]).Err, context.Canceled)
	}
	px.slow.Store(false)
	require.Eventually(t, func() bool { return len(f.Rows(t)) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the locks acquired for callers that had left stay: %v", f.Rows(t))
}

// Batches that every caller left, and that still wait for their answers
// (here for the table that DDL holds; on a silent server, for ever), each
// hold a connection of the pool: past two, of any kind, the queues wait
// for it rather than send more, their callers leave at their deadlines,
// and reads still find connections.
func TestGroupCommit_DetachedBatchesAreBounded(t *testing.T) {
	f := newBatchFixture(t)
	ctx := context.Background()
	held, err := f.Store.AcquireAt(ctx, plan("held"), "h", now(time.Minute))
	require.NoError(t, err)
	f.BlockWrites(t)
	lone, leaveLone := context.WithCancel(ctx)
	loneDone := make(chan error, 2)
	go func() {
		_, err := f.Store.AcquireAt(lone, plan("pilot-alone"), "pilot", now(time.Minute))
		loneDone <- err
	}()
	go func() {
		_, err := f.Store.RenewAt(lone, plan("pilot-renew"), "pilot", now(time.Minute))
		loneDone <- err
	}()
	require.Eventually(t, func() bool { return f.Waiting(t, "") == 2 }, 10*time.Second, time.Millisecond)
	for i := range 8 {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if i%2 == 0 {
			_, err = f.Store.AcquireAt(cctx, plan(fmt.Sprintf("r%d", i)), "o", now(time.Minute))
		} else {
			_, err = f.Store.RenewTokenAt(cctx, plan("held"), "h", held.Lock.Token, now(time.Minute))
		}
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "caller %d", i)
	}
	assert.Equal(t, 2, f.Waiting(t, "unnest"), "batches waiting for their answers")
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = f.Store.Get(rctx, plan("held"))
	require.NoError(t, err, "a read while batches wait for the table")
	leaveLone()
	require.ErrorIs(t, <-loneDone, context.Canceled)
	require.ErrorIs(t, <-loneDone, context.Canceled)
	f.Unblock()
	require.Eventually(t, func() bool { return f.Waiting(t, "") == 0 && len(f.Rows(t)) == 1 }, 10*time.Second, time.Millisecond,
		"the locks of the callers that left stay: %v", f.Rows(t))
	_, err = f.Store.AcquireAt(rctx, plan("after"), "after", now(time.Minute))
	require.NoError(t, err)
}

// The lock a batch acquired for a caller that left is released only as
// the batch wrote it: when the same owner acquires again first, that
// re-entry keeps the token, and the lock is that caller's.
func TestGroupCommit_AnUndoSparesTheSameOwnersNextAcquire(t *testing.T) {
	const n = 64
	f := newBatchFixture(t)
	svc, err := application.NewLockService(f.Store, postgres.SystemClock{}, time.Minute)
	require.NoError(t, err)
	owners, refs := members(n)
	ctxs, cancels := make([]context.Context, n), make([]context.CancelFunc, n)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
	}
	out := f.Acquires(t, ctxs, owners, refs)
	for i, cancel := range cancels {
		cancel()
		require.ErrorIs(t, (<-out[i]).Err, context.Canceled)
	}
	f.Unblock()
	got := make([]domain.Lock, n)
	var wg sync.WaitGroup
	for i := range refs {
		wg.Go(func() {
			var err error
			got[i], err = svc.Acquire(context.Background(), owners[i], refs[i], time.Minute)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	// The undos run after the batch's answer, beside the acquires above;
	// none may take what those acquires were told they hold.
	// A loop, not assert.Never: Never's last check may still run on its own
	// goroutine after the test ends, against a database already closed.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		require.GreaterOrEqual(t, len(f.Rows(t)), n, "an undo removed a lock that its owner's next acquire was told it holds")
	}
	rows := f.Rows(t)
	for i := range refs {
		assert.Equal(t, owners[i], rows[refs[i].ID], "%s", refs[i])
	}
}

// A renewal whose row another transaction holds (a release of all an
// owner's locks holds each row it deleted until it ends) waits on its
// own; the other renewals of its batch do not wait for it.
func TestGroupCommit_ARenewalOfABusyRowDelaysNoOne(t *testing.T) {
	f := newBatchFixture(t)
	ctx := context.Background()
	a, err := f.Store.AcquireAt(ctx, plan("A"), "a", now(time.Minute))
	require.NoError(t, err)
	s, err := f.Store.AcquireAt(ctx, plan("S"), "b", now(time.Minute))
	require.NoError(t, err)
	holder, err := f.Admin.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { holder.Rollback() })
	_, err = holder.Exec("SELECT id FROM locks WHERE resource_id = 'A' FOR UPDATE")
	require.NoError(t, err)

	send := f.HoldQueue(t, func(ctx context.Context, id string) error {
		_, err := f.Store.RenewTokenAt(ctx, plan(id), "x", 1, now(time.Minute))
		return err
	})
	renewed := make([]chan error, 2)
	for i, r := range []struct {
		ref   domain.ResourceRef
		owner string
		token int64
	}{{plan("A"), "a", a.Lock.Token}, {plan("S"), "b", s.Lock.Token}} {
		renewed[i] = make(chan error, 1)
		go func() {
			_, err := f.Store.RenewTokenAt(ctx, r.ref, r.owner, r.token, now(2*time.Minute))
			renewed[i] <- err
		}()
	}
	send(2)
	f.Unblock()
	select {
	case err := <-renewed[1]:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the renewal of S waited for another transaction's lock on A's row")
	}
	select {
	case err := <-renewed[0]:
		t.Fatalf("the renewal of A did not wait for its row: %v", err)
	default:
	}
	require.NoError(t, holder.Rollback())
	require.NoError(t, <-renewed[0])
}

// The same with the same timing for the batch and the retries (a clock
// that stands still, or two calls in one microsecond): the retry's
// re-entry writes the batch's very expiry, and still keeps its lock, as
// the undo names the row version the batch wrote.
func TestGroupCommit_AnUndoSparesAReentryOfTheSameTiming(t *testing.T) {
	const n = 64
	f := newBatchFixture(t)
	at := testdb.Now(time.Minute)
	n0, e0 := at()
	same := func() (time.Time, time.Time) { return n0, e0 }
	send := f.HoldQueue(t, func(ctx context.Context, id string) error {
		_, err := f.Store.AcquireAt(ctx, plan(id), "pilot", now(time.Minute))
		return err
	})
	owners, refs := members(n)
	leaving, leave := context.WithCancel(context.Background())
	out := make([]chan error, n)
	for i := range refs {
		out[i] = make(chan error, 1)
		go func() { _, err := f.Store.AcquireAt(leaving, refs[i], owners[i], same); out[i] <- err }()
	}
	send(n)
	leave()
	for i := range out {
		require.ErrorIs(t, <-out[i], context.Canceled)
	}
	f.Unblock()
	// The retries go through the service, on a clock that stands at the
	// batch's now: it decides what the store leaves to Update.
	svc, err := application.NewLockService(f.Store, standing(n0), time.Minute)
	require.NoError(t, err)
	require.Equal(t, e0, n0.Add(time.Minute))
	var wg sync.WaitGroup
	for i := range refs {
		wg.Go(func() {
			_, err := svc.Acquire(context.Background(), owners[i], refs[i], time.Minute)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	// Polled here, not with assert.Never, whose condition may still be
	// reading when it returns, after the fixture's cleanup closed the pool.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		require.GreaterOrEqual(t, len(f.Rows(t)), n, "an undo removed a lock that its owner's next acquire was told it holds")
	}
}

// standing is a clock that stands still.
type standing time.Time

func (s standing) Now() time.Time { return time.Time(s) }
