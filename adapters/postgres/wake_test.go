package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// Two DBs opened on one store stand for two processes (their listeners
// are separate connections with separate instance ids); every wait below
// is for an event, bounded only to fail rather than hang.

var plan2 = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-2"}

// openPair opens two DBs on one new schema, closed when the test ends.
func openPair(t *testing.T) (dsn string, a, b *postgres.DB) {
	t.Helper()
	dsn = testdb.Postgres(t)
	open := func() *postgres.DB {
		db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		return db
	}
	return dsn, open(), open()
}

// listening waits until db's listener listens, and returns its backend.
func listening(t *testing.T, db *postgres.DB) uint32 {
	t.Helper()
	postgres.AwaitListener(t, db, "the listener to connect", func() bool { return postgres.ListenerPID(db) != 0 })
	return postgres.ListenerPID(db)
}

// woken fails unless c receives within a bound.
func woken(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatalf("no wake-up: %s", what)
	}
}

// drain empties c of the wake-up that a connect sends every watcher.
func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// watchListening watches two resources through db until the test ends,
// once both watches are in force, with no wake-up pending.
func watchListening(t *testing.T, db *postgres.DB, r1, r2 domain.ResourceRef) (c1, c2 <-chan struct{}) {
	t.Helper()
	c1, stop1 := db.Wakeups().Watch(r1)
	t.Cleanup(stop1)
	c2, stop2 := db.Wakeups().Watch(r2)
	t.Cleanup(stop2)
	postgres.AwaitListener(t, db, "the watches to come into force", func() bool {
		return postgres.Watching(db, r1) && postgres.Watching(db, r2)
	})
	drain(c1)
	drain(c2)
	return c1, c2
}

func acquire(t *testing.T, db *postgres.DB, ref domain.ResourceRef, owner string) domain.Lock {
	t.Helper()
	a, err := postgres.NewLockRepository(db).AcquireAt(context.Background(), ref, owner, func() (time.Time, time.Time) {
		now := time.Now()
		return now, now.Add(time.Minute)
	})
	require.NoError(t, err)
	return a.Lock
}

func TestWakeups_ReleaseWakesAnotherProcess(t *testing.T) {
	ctx := context.Background()
	_, a, b := openPair(t)
	repo := postgres.NewLockRepository(a)
	c1, c2 := watchListening(t, b, plan1, plan2)

	acquire(t, a, plan1, "A")
	ok, err := repo.DeleteOwned(ctx, plan1, "A")
	require.NoError(t, err)
	require.True(t, ok, "the release removed the lock")
	woken(t, c1, "a release by owner")

	l := acquire(t, a, plan1, "A")
	ok, err = repo.DeleteToken(ctx, plan1, l.Token, time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	woken(t, c1, "a release by token")

	// A release of several locks notifies "any lock": it wakes plan2's
	// watcher too, and still counts the rows.
	acquire(t, a, plan1, "A")
	acquire(t, a, plan2, "A")
	n, err := repo.DeleteAllOwned(ctx, "A")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	woken(t, c1, "a release of all an owner's locks (plan1)")
	woken(t, c2, "a release of all an owner's locks (plan2)")

	// A release that removed nothing says so, as before.
	ok, err = repo.DeleteOwned(ctx, plan1, "A")
	require.NoError(t, err)
	require.False(t, ok)
	n, err = repo.DeleteAllOwned(ctx, "A")
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestWakeups_RolledBackReleaseSendsNothing(t *testing.T) {
	ctx := context.Background()
	dsn, a, b := openPair(t)
	c1, c2 := watchListening(t, b, plan1, plan2)
	acquire(t, a, plan1, "A")
	acquire(t, a, plan2, "A")

	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer raw.Close()
	release := postgres.ReleaseSQL(a, `DELETE FROM "locks" WHERE "resource_type" = $1 AND "resource_id" = $2`)
	tx, err := raw.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := tx.ExecContext(ctx, release, string(plan1.Type), plan1.ID)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the statement counts the rows it deleted")
	require.NoError(t, tx.Rollback())

	// Notifications arrive in commit order: once plan2's committed release
	// is heard, plan1's would have been, had it been sent.
	ok, err := postgres.NewLockRepository(a).DeleteOwned(ctx, plan2, "A")
	require.NoError(t, err)
	require.True(t, ok)
	woken(t, c2, "the committed release")
	select {
	case <-c1:
		t.Fatal("a release that was rolled back woke its watcher")
	default:
	}
}

func TestWakeups_ListenerReconnects(t *testing.T) {
	ctx := context.Background()
	dsn, a, b := openPair(t)
	c, stop := b.Wakeups().Watch(plan1)
	defer stop()
	pid := listening(t, b)
	drain(c)

	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer raw.Close()
	var name string
	require.NoError(t, raw.QueryRowContext(ctx, "SELECT application_name FROM pg_stat_activity WHERE pid = $1", pid).Scan(&name))
	assert.Contains(t, name, "cleveragents-locks listener", "the listener is recognisable in pg_stat_activity")
	var killed bool
	require.NoError(t, raw.QueryRowContext(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&killed))
	require.True(t, killed)

	postgres.AwaitListener(t, b, "the listener to reconnect", func() bool {
		p := postgres.ListenerPID(b)
		return p != 0 && p != pid
	})
	woken(t, c, "the reconnect, after which notifications may have been lost")
	// The watch lock went with the old session: the new one takes it
	// again, and the watch is in force once it has.
	postgres.AwaitListener(t, b, "the watch to be in force again", func() bool { return postgres.Watching(b, plan1) })
	drain(c)

	acquire(t, a, plan1, "A")
	ok, err := postgres.NewLockRepository(a).DeleteOwned(ctx, plan1, "A")
	require.NoError(t, err)
	require.True(t, ok)
	woken(t, c, "a release after the reconnect")
}

// A release of a lock that nobody watches notifies nobody, alone or in a
// batch: a notification wakes every listener of the database, in every
// process, for nothing.
func TestWakeups_AReleaseNobodyWatchesSendsNothing(t *testing.T) {
	ctx := context.Background()
	dsn, a, b := openPair(t)
	_, c2 := watchListening(t, b, plan1, plan2)
	heard := listen(t, dsn, postgres.Channel(a))
	unwatched := domain.ResourceRef{Type: domain.ResourcePlan, ID: "unwatched"}

	repo := postgres.NewLockRepository(a)
	for _, store := range []*postgres.LockRepository{repo, repo.InBatches()} {
		acquire(t, a, unwatched, "A")
		ok, err := store.DeleteOwned(ctx, unwatched, "A")
		require.NoError(t, err)
		require.True(t, ok)
		l := acquire(t, a, unwatched, "A")
		ok, err = store.DeleteToken(ctx, unwatched, l.Token, time.Now())
		require.NoError(t, err)
		require.True(t, ok)
		// Notifications arrive in commit order: once the watched
		// resource's is heard, the others would have been, had they been
		// sent.
		acquire(t, a, plan2, "A")
		ok, err = store.DeleteOwned(ctx, plan2, "A")
		require.NoError(t, err)
		require.True(t, ok)
		woken(t, c2, "a release of a watched lock")
		require.Equal(t, "rplan:plan-2", <-heard, "the first release notification after the unwatched ones")
	}
}

// listen returns the payloads of the release notifications on channel,
// heard on a connection of its own, in order.
func listen(t *testing.T, dsn, channel string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)
	heard := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			if p := n.Payload; p != "" && (p[0] == 'r' || p[0] == '*') {
				heard <- p
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close(context.Background())
	})
	return heard
}

// A watch comes into force once the listener holds its watch lock: a
// release before that did not notify, so the watcher is woken then, to
// look at the store.
func TestWakeups_AWatchInForceWakesItsWatcher(t *testing.T) {
	_, _, b := openPair(t)
	b.Wakeups().Contended(plan1) // starts the listener
	listening(t, b)
	c, stop := b.Wakeups().Watch(plan1)
	defer stop()
	postgres.AwaitListener(t, b, "the watch to come into force", func() bool { return postgres.Watching(b, plan1) })
	woken(t, c, "the watch's coming into force")
	stop()
	postgres.AwaitListener(t, b, "the watch lock to be dropped", func() bool { return !postgres.Watching(b, plan1) })
}

// A process watches at most MaxWatched resources at once, each with a
// lock in the server's lock table, which the whole server shares: past
// the bound, Watch says it cannot watch (a nil channel: the waiter
// polls), and a watch that ends makes room. A closed store holds none.
func TestWakeups_WatchesAreBounded(t *testing.T) {
	ctx := context.Background()
	dsn, _, b := openPair(t)
	w := b.Wakeups()
	ref := func(i int) domain.ResourceRef {
		return domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("w-", i)}
	}
	stops := make([]func(), postgres.MaxWatched)
	for i := range stops {
		c, stop := w.Watch(ref(i))
		require.NotNil(t, c, "watch %d of %d", i+1, postgres.MaxWatched)
		stops[i] = stop
	}
	c, stop := w.Watch(ref(-1))
	require.Nil(t, c, "a watch past the bound")
	stop()
	c, stop = w.Watch(ref(0))
	require.NotNil(t, c, "a second watch of a watched resource")
	stop()

	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer raw.Close()
	held := func() int {
		var n int
		require.NoError(t, raw.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND classid = $1 AND pid = $2 AND granted`,
			postgres.WatchClass, postgres.ListenerPID(b)).Scan(&n))
		return n
	}
	postgres.AwaitListener(t, b, "the watch locks", func() bool { return postgres.Watching(b, ref(postgres.MaxWatched-1)) })
	require.Equal(t, postgres.MaxWatched, held(), "watch locks held by the listener")

	stops[0]()
	c, stop = w.Watch(ref(-1))
	require.NotNil(t, c, "a watch once another ended")
	defer stop()
	postgres.AwaitListener(t, b, "the new watch lock", func() bool { return postgres.Watching(b, ref(-1)) })
	require.Equal(t, postgres.MaxWatched, held(), "watch locks held by the listener")

	pid := postgres.ListenerPID(b)
	require.NoError(t, b.Close())
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, raw.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND classid = $1 AND pid = $2`, postgres.WatchClass, pid).Scan(&n))
		return n == 0
	}, 10*time.Second, time.Millisecond, "watch locks left after Close")
}

func TestWakeups_Contended(t *testing.T) {
	dsn, a, b := openPair(t)
	wa := a.Wakeups()
	require.False(t, wa.Contended(plan1), "nobody watches")
	listening(t, a)
	contended := func(ref domain.ResourceRef, want bool) func() bool {
		return func() bool { return wa.Contended(ref) == want }
	}

	_, stopB := b.Wakeups().Watch(plan1)
	postgres.AwaitListener(t, a, "A to hear that B watches", contended(plan1, true))
	assert.False(t, b.Wakeups().Contended(plan1), "a process's own watch does not make it contended")
	stopB()
	postgres.AwaitListener(t, a, "A to hear that B stopped", contended(plan1, false))

	// A process that starts after B watches learns of it on connecting.
	_, stopB = b.Wakeups().Watch(plan1)
	defer stopB()
	c, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	c.Wakeups().Contended(plan1) // starts its listener
	postgres.AwaitListener(t, c, "a new process to hear that B watches", func() bool { return c.Wakeups().Contended(plan1) })

	// C watches too, then closes while watching: its marks go at once.
	_, stopC := c.Wakeups().Watch(plan2)
	defer stopC()
	postgres.AwaitListener(t, a, "A to hear that C watches", contended(plan2, true))
	require.NoError(t, c.Close())
	postgres.AwaitListener(t, a, "A to hear that C closed", contended(plan2, false))
	assert.True(t, wa.Contended(plan1), "B still watches")
}

func TestWakeups_OwnWatchIsNotContended(t *testing.T) {
	_, a, b := openPair(t)
	_, stopA := a.Wakeups().Watch(plan1)
	defer stopA()
	_, stopB := b.Wakeups().Watch(plan2)
	postgres.AwaitListener(t, b, "B to hear that A watches plan1", func() bool { return b.Wakeups().Contended(plan1) })
	// B's next announcement is sent after A's, so it is heard after A's
	// own, which A must have ignored.
	stopB()
	postgres.AwaitListener(t, a, "A to hear that B watched and stopped", func() bool { return !a.Wakeups().Contended(plan2) })
	assert.False(t, a.Wakeups().Contended(plan1))
}

func TestWakeups_DeadProcessAgesOut(t *testing.T) {
	ctx := context.Background()
	dsn, a, _ := openPair(t)
	wa := a.Wakeups()
	wa.Contended(plan1)
	listening(t, a)
	// A process that announced a watch and died without a word.
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer raw.Close()
	_, err = raw.ExecContext(ctx, "SELECT pg_notify($1, $2)", postgres.Channel(a), "+0123456789abcdef:plan:plan-1")
	require.NoError(t, err)
	postgres.AwaitListener(t, a, "A to hear the watch", func() bool { return wa.Contended(plan1) })
	postgres.AgeMarks(a, postgres.RemoteTTL+time.Second)
	assert.False(t, wa.Contended(plan1), "a mark that is not announced again ages out")
}

func TestWakeups_CloseWithWatchesInFlight(t *testing.T) {
	db, err := postgres.Open(context.Background(), testdb.Postgres(t), postgres.Options{})
	require.NoError(t, err)
	w := db.Wakeups()
	_, stop1 := w.Watch(plan1)
	c2, stop2 := w.Watch(plan2)
	listening(t, db)
	require.NoError(t, db.Close())
	stop1()
	stop2()
	drain(c2)
	c, stop := w.Watch(plan1) // after Close: a channel that never receives
	stop()
	select {
	case <-c:
		t.Fatal("a watch after Close received")
	default:
	}
	assert.False(t, w.Contended(plan1))
	// TestMain's goleak check fails the package if the listener's
	// goroutine outlived Close.
}

// A takeover replaces a lock that its holder may still think its own (its
// process paused, or its clock behind): the holder's watch in another
// process hears it, whether the takeover is one statement (AcquireAt) or
// an Update.
func TestWakeups_TakeoverWakesTheHoldersWatch(t *testing.T) {
	ctx := context.Background()
	_, a, b := openPair(t)
	repo := postgres.NewLockRepository(a)
	c1, c2 := watchListening(t, b, plan1, plan2)
	lapsed := func() (time.Time, time.Time) {
		at := time.Now().Add(-2 * time.Minute) // expired a minute ago
		return at, at.Add(time.Minute)
	}

	_, err := repo.AcquireAt(ctx, plan1, "A", lapsed)
	require.NoError(t, err)
	took := acquire(t, a, plan1, "B")
	require.Equal(t, "B", took.Owner)
	woken(t, c1, "a takeover in one statement")

	now := time.Now().UTC().Truncate(time.Microsecond)
	insert := func(owner string, acquired time.Time) application.Decide {
		return func(*domain.Lock) (application.Change, error) {
			return application.Change{Kind: application.ChangeInsert,
				Lock: domain.Lock{Owner: owner, AcquiredAt: acquired, ExpiresAt: acquired.Add(time.Minute)}}, nil
		}
	}
	_, err = repo.Update(ctx, plan2, insert("A", now.Add(-2*time.Minute)))
	require.NoError(t, err)
	_, err = repo.Update(ctx, plan2, insert("B", now))
	require.NoError(t, err)
	woken(t, c2, "a takeover by Update")
}
