package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// A cleanup must not delete a lock that a renew extended while the cleanup
// waited for the row. The renew's commit is held open by a deferred
// trigger that sleeps, so the cleanup surely queues behind it.
func TestDeleteExpired_SparesALockRenewedMeanwhile(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	db, err := postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	repo := postgres.NewLockRepository(db)
	start := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	mc := clock.NewMock()
	mc.Set(start)
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)

	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer admin.Close()
	slowCommits(t, admin, 2)

	mc.Set(start.Add(4 * time.Second)) // one second before the expiry
	renewed := make(chan error, 1)
	go func() { _, err := svc.Renew(ctx, "A", plan1, 5*time.Second); renewed <- err }()
	// Wait until the renew has updated the row and sleeps in its commit.
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "the renew never reached its commit")

	// A cleanup by a host whose clock is two seconds ahead: at its now,
	// the row it can see has expired.
	n, err := repo.DeleteExpired(ctx, start.Add(6*time.Second), 1000)
	require.NoError(t, err)
	require.NoError(t, <-renewed, "the renew succeeded")
	assert.Zero(t, n, "the cleanup deleted a lock that had been renewed")
	l, err := repo.Get(ctx, plan1)
	require.NoError(t, err, "the renewed lock is still stored")
	assert.Equal(t, start.Add(9*time.Second), l.ExpiresAt)
}

// slowCommits makes every transaction that updates a lock sleep for
// seconds in its commit (a deferred trigger), so that another statement
// surely queues behind it.
func slowCommits(t *testing.T, admin *sql.DB, seconds int) {
	t.Helper()
	for _, q := range []string{
		fmt.Sprintf(`CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%d); RETURN NULL; END $$`, seconds),
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON locks DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`,
	} {
		_, err := admin.Exec(q)
		require.NoError(t, err, q)
	}
}

// List orders ids by their bytes whatever the database's collation; an
// ICU en-US database sorts "_x a a-2 a1 B Zeta" by itself.
func TestList_ByteOrderUnderICUCollation(t *testing.T) {
	base := testdb.Postgres(t)
	ctx := context.Background()
	name := fmt.Sprintf("locks_icu_%d", os.Getpid())
	admin, err := sql.Open("pgx", os.Getenv(testdb.EnvPostgres))
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name)
	_, err = admin.Exec("CREATE DATABASE " + name + " TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
	if err != nil {
		t.Skipf("this server cannot create an ICU database: %v", err)
	}
	t.Cleanup(func() {
		_, err := admin.Exec("DROP DATABASE " + name + " WITH (FORCE)")
		require.NoError(t, err)
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.Path = "/" + name
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()

	db, err := postgres.Open(ctx, u.String(), postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	for _, id := range []string{"a1", "Zeta", "_x", "a-2", "B", "a"} {
		_, err := svc.Acquire(ctx, "A", domain.ResourceRef{Type: domain.ResourcePlan, ID: id}, 0)
		require.NoError(t, err)
	}
	all, err := svc.List(ctx, application.ListOptions{})
	require.NoError(t, err)
	var got []string
	for _, l := range all {
		got = append(got, l.Resource.ID)
	}
	assert.Equal(t, []string{"B", "Zeta", "_x", "a", "a-2", "a1"}, got)
}

// An acquire whose caller gives up while the statement commits leaves no
// lock behind once the statement's answer comes: no resource stays taken,
// until its TTL, for a caller that was told it failed. The commit is held
// up after its record is written (commit_delay, with no siblings needed),
// where a cancel cannot stop it.
func TestAcquire_ACallerThatLeftDuringTheCommitLeavesNoLock(t *testing.T) {
	for _, tc := range []struct {
		name    string
		expired bool // the resource holds another owner's expired lock (acquireSQL replaces it)
	}{{"free resource", false}, {"expired lock", true}} {
		t.Run(tc.name, func(t *testing.T) {
			db, svc, admin := slowCommitService(t)
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			ref := leaveDuringCommit(t, svc, admin, tc.expired)

			// Another owner's acquire waits for the left one's transaction
			// (the resource's advisory lock), then meets its lock until
			// the undo: the resource must come free soon after.
			require.Eventually(t, func() bool {
				_, err := svc.Acquire(context.Background(), "C", ref, time.Minute)
				return err == nil
			}, 10*time.Second, 10*time.Millisecond, "the resource stayed taken after its acquirer had left")
			var n int
			require.NoError(t, admin.QueryRow(`SELECT count(*) FROM locks WHERE resource_id = $1 AND owner_id = 'A'`, ref.ID).Scan(&n))
			require.Zero(t, n, "the lock of a caller told that its acquire failed is still held")
		})
	}
}

// Closing the store right after such a caller left, as the agents CLI
// does when its --deadline ends, still leaves no lock: Close waits, a
// moment, for the acquire's answer and releases what it took.
func TestClose_ReleasesTheAcquireOfACallerThatLeft(t *testing.T) {
	db, svc, admin := slowCommitService(t)
	ref := leaveDuringCommit(t, svc, admin, false)
	require.NoError(t, db.Close())

	var n int
	require.NoError(t, admin.QueryRow(`SELECT count(*) FROM locks WHERE resource_id = $1 AND owner_id = 'A'`, ref.ID).Scan(&n))
	require.Zero(t, n, "a lock is held for a caller that was told its acquire failed, after the store closed")
}

// leaveDuringCommit has owner A acquire a resource with a context that
// ends 30 ms later, while the acquire's commit waits, and returns the
// resource. The commit waits only when no other session has flushed the
// WAL past its record meanwhile (a busy server does so): an acquire that
// succeeds is released, and the next resource is tried. With expired, the
// resource first holds another owner's expired lock.
func leaveDuringCommit(t *testing.T, svc *application.LockService, admin *sql.DB, expired bool) domain.ResourceRef {
	t.Helper()
	ctx := context.Background()
	for i := range 20 {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("left-", i)}
		if expired {
			_, err := admin.Exec(`INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at)
VALUES ('B', $1, $2, '2000-01-01T00:00:00.000000Z', '2000-01-01T00:00:01.000000Z')`, string(ref.Type), ref.ID)
			require.NoError(t, err)
		}
		left, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		_, err := svc.Acquire(left, "A", ref, time.Hour)
		cancel()
		if err == nil {
			ok, err := svc.Release(ctx, "A", ref)
			require.NoError(t, err)
			require.True(t, ok)
			continue
		}
		require.ErrorIs(t, err, context.DeadlineExceeded)
		return ref
	}
	t.Fatal("no acquire outlasted its caller's context in 20 tries: the commits did not wait")
	return domain.ResourceRef{}
}

// slowCommitService returns a store whose commits wait 100 ms after their
// record is written (commit_delay, with no siblings needed), where a
// cancel cannot stop them, a service on it, and a connection of the
// test's own to the same schema.
func slowCommitService(t *testing.T) (*postgres.DB, *application.LockService, *sql.DB) {
	t.Helper()
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(context.Background(), withParam(t, dsn, "options", "-c commit_delay=100000 -c commit_siblings=0"), postgres.Options{})
	require.NoError(t, err)
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	return db, svc, admin
}

// Callers that give up on a resource another session holds, one after
// another, do not take the pool from every other call: at most a few of
// their statements go on after them, and the rest are cut as they leave.
// Found by an outside review: twelve acquires that gave up after 50 ms
// each left a statement holding a connection for 10 s, and an acquire of
// a free resource, a renewal and a read then waited for the pool.
func TestAcquire_CallersThatLeaveDoNotTakeThePool(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	db, svc := unclosedService(t, dsn)

	busy := domain.ResourceRef{Type: domain.ResourcePlan, ID: "busy"}
	holder := rawPG(t, dsn)
	hold, err := holder.Conn(ctx)
	require.NoError(t, err)
	defer hold.Close()
	_, err = hold.ExecContext(ctx, "SELECT pg_advisory_lock($1)", postgres.ResourceKey(busy))
	require.NoError(t, err)

	for range 12 {
		left, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := svc.Acquire(left, "A", busy, time.Minute)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	soon, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = svc.Acquire(soon, "B", plan1, time.Minute)
	require.NoError(t, err, "an acquire of a free resource waited for a pool that callers who had left were holding")

	_, err = hold.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", postgres.ResourceKey(busy))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := svc.Get(ctx, busy)
		return errors.Is(err, domain.ErrNotFound)
	}, 10*time.Second, 10*time.Millisecond, "an acquire whose caller left holds the resource")

	// The statements cut past the bound got no answer the store could
	// read (the driver reports its cancel as the context's error, whether
	// the server cancelled the statement or committed it): Close says so.
	err = db.Close()
	require.ErrorIs(t, err, domain.ErrUnavailable)
	require.Contains(t, err.Error(), "were cut or got no answer")
	require.Contains(t, err.Error(), "until their TTL")
}

// A store that closes before the answer of an acquire whose caller left
// says so: if that acquire committed, its lock lasts until its TTL.
func TestClose_SaysWhenAnAcquireWhoseCallerLeftHadNoAnswer(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	db, svc := unclosedService(t, dsn)
	admin := rawPG(t, dsn)
	for _, q := range []string{
		`CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_insert AFTER INSERT ON locks DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_insert()`,
	} {
		_, err := admin.Exec(q)
		require.NoError(t, err, q)
	}

	left, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := svc.Acquire(left, "A", plan1, time.Minute)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	err = db.Close()
	require.Error(t, err, "Close said nothing of an acquire it gave up waiting for")
	require.Contains(t, err.Error(), "until their TTL")
	require.ErrorIs(t, err, domain.ErrUnavailable)
}

// Closing the store right after callers left acquires that went in a
// batch leaves no lock either: Close waits, a moment, for the batch's
// answer and releases what it took, rather than cut its commit, which
// the server completes unseen. Found by an outside review: three acquires
// that gave up 30 ms into 100 ms commits, one alone and two in a batch,
// and a Close at once, left the batch's two locks held, and Close said
// nothing, 6 times out of 6.
func TestClose_ReleasesTheBatchAcquiresOfCallersThatLeft(t *testing.T) {
	db, svc, admin := slowCommitService(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			left, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			defer cancel()
			_, errs[i] = svc.Acquire(left, "A", domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("batch-left-", i)}, time.Hour)
		})
		time.Sleep(5 * time.Millisecond) // the first runs alone, the others queue behind it
	}
	wg.Wait()
	require.NoError(t, db.Close(), "Close gave up on writes whose answers come within 100 ms")

	var n int
	require.NoError(t, admin.QueryRow(`SELECT count(*) FROM locks WHERE owner_id = 'A'`).Scan(&n))
	for i, err := range errs {
		if err == nil {
			n-- // its commit did not wait (another session flushed past it): it holds its lock, rightly
			t.Logf("acquire %d succeeded", i)
		} else {
			require.ErrorIs(t, err, context.DeadlineExceeded)
		}
	}
	require.Zero(t, n, "locks are held for callers that were told their acquires failed, after the store closed")
}

// An Update (the transaction that takes over a dead holder's lock, or
// decides what the one-statement acquire left to it) whose caller leaves
// while it commits leaves no lock either: the transaction goes on to its
// answer and its acquisition is undone. Found by an outside review: a
// takeover of a dead process's lock cut 50 ms before its 100 ms commit
// ended told its caller it failed, and its lock refused every other
// owner, 6 times out of 6.
func TestUpdate_ACallerThatLeftDuringTheCommitLeavesNoLock(t *testing.T) {
	for _, closeAtOnce := range []bool{false, true} {
		t.Run(fmt.Sprint("close at once=", closeAtOnce), func(t *testing.T) {
			db, _, admin := slowCommitService(t)
			repo := postgres.NewLockRepository(db)
			ctx := context.Background()
			var ref domain.ResourceRef
			for i := range 20 {
				ref = domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("update-left-", i)}
				left, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
				_, err := repo.Update(left, ref, func(*domain.Lock) (application.Change, error) {
					now := time.Now().UTC()
					return application.Change{Kind: application.ChangeInsert,
						Lock: domain.Lock{Owner: "A", Resource: ref, AcquiredAt: now, ExpiresAt: now.Add(time.Hour)}}, nil
				})
				cancel()
				if err != nil {
					require.ErrorIs(t, err, context.DeadlineExceeded)
					break
				}
				// Its commit did not wait (another session flushed past
				// it): it holds its lock, rightly; try another.
				_, err = admin.Exec(`DELETE FROM locks WHERE resource_id = $1`, ref.ID)
				require.NoError(t, err)
				require.Less(t, i, 19, "no Update outlasted its caller's context in 20 tries: the commits did not wait")
			}
			held := func() int {
				var n int
				require.NoError(t, admin.QueryRow(`SELECT count(*) FROM locks WHERE resource_id = $1 AND owner_id = 'A'`, ref.ID).Scan(&n))
				return n
			}
			if closeAtOnce {
				require.NoError(t, db.Close())
				require.Zero(t, held(), "a lock is held for a caller that was told its Update failed, after the store closed")
				return
			}
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			require.Eventually(t, func() bool { return held() == 0 }, 10*time.Second, 10*time.Millisecond,
				"the lock of a caller told that its Update failed is still held")
		})
	}
}

// unclosedService opens a store at dsn and a service on it with the real
// clock, for a test that closes the store itself and checks what Close
// says.
func unclosedService(t *testing.T, dsn string) (*postgres.DB, *application.LockService) {
	t.Helper()
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	return db, svc
}
