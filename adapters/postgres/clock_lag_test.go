package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
	"github.com/cleveragents/locks/tests/testdb"
)

// mockHost is a host's clock that moves only when the test moves it, its
// monotonic reading with it: a postgres.MonotonicClock.
type mockHost struct {
	*testclock.Clock
	start time.Time
}

func newMockHost(start time.Time) mockHost { return mockHost{testclock.New(start), start} }

func (h mockHost) Monotonic() time.Duration { return h.Now().Sub(h.start) }

// virtualServer is a server whose clock the test sets: for the
// connections of DSN, pg_catalog's clock_timestamp() and
// statement_timestamp() are shadowed by functions of the scratch schema,
// which DSN's search_path puts before pg_catalog, reading a table. The
// server's clock then stands still until Step, as the host's mock clock
// does until Add: the two move together, and apart when the test says.
type virtualServer struct {
	DSN   string
	t     *testing.T
	admin func(query string, args ...any)
	at    time.Time
}

func newVirtualServer(t *testing.T, at time.Time) *virtualServer {
	t.Helper()
	dsn := testdb.Postgres(t)
	schema := schemaOf(t, dsn)
	raw := rawPG(t, dsn)
	v := &virtualServer{t: t, at: at}
	v.admin = func(query string, args ...any) {
		t.Helper()
		_, err := raw.Exec(query, args...)
		require.NoError(t, err, query)
	}
	v.admin("CREATE TABLE server_clock (at timestamptz NOT NULL)")
	v.admin("INSERT INTO server_clock VALUES ($1)", at)
	for _, fn := range []string{"clock_timestamp", "statement_timestamp"} {
		v.admin(fmt.Sprintf(`CREATE FUNCTION %[1]s.%[2]s() RETURNS timestamptz VOLATILE LANGUAGE sql AS 'SELECT at FROM %[1]s.server_clock'`, schema, fn))
	}
	v.DSN = withParam(t, withParam(t, dsn, "search_path", schema+",pg_catalog"), "application_name", appName(t))
	return v
}

// Step moves the server's clock by d.
func (v *virtualServer) Step(d time.Duration) {
	v.t.Helper()
	v.at = v.at.Add(d)
	v.admin("UPDATE server_clock SET at = $1", v.at)
}

// Now is the server's time.
func (v *virtualServer) Now() time.Time { return v.at }

// requireEstimate checks that sc's estimate is the server's time within
// the uncertainty sc states: both clocks stand still, so exactly.
func requireEstimate(t *testing.T, server *virtualServer, sc *postgres.ServerClock, msg string) {
	t.Helper()
	_, uncertainty, err := sc.Offset()
	require.NoError(t, err)
	off := sc.Now().Sub(server.Now())
	require.LessOrEqual(t, off.Abs(), uncertainty,
		"%s: the host's estimate of the server's time is off by %v, beyond the uncertainty %v it states", msg, off, uncertainty)
}

// A host's estimate of the server's time lags 3 s (the server's clock
// stepped forward after the last measurement; a host's monotonic clock
// that stood still for 3 s does the same): every acquire and renewal
// reads the server's clock, and the estimate agrees with it again, within
// the uncertainty it states, once one has answered; with group commit's
// batch statements too.
func TestServerClock_LagCorrectedByTheNextWrite(t *testing.T) {
	const ttl = 10 * time.Second
	start := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	plan3 := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-3"}
	writes := []struct {
		name string
		do   func(ctx context.Context, svc *application.LockService, held *application.Handle) error
	}{
		{"acquire a free resource", func(ctx context.Context, svc *application.LockService, _ *application.Handle) error {
			_, err := svc.Acquire(ctx, "A", plan2, ttl)
			return err
		}},
		{"acquire again", func(ctx context.Context, svc *application.LockService, _ *application.Handle) error {
			_, err := svc.Acquire(ctx, "A", plan1, ttl)
			return err
		}},
		{"take over an expired lock", func(ctx context.Context, svc *application.LockService, _ *application.Handle) error {
			h, err := svc.Take(ctx, "B", plan3, application.AcquireOptions{})
			if err == nil && h.Lock().Owner != "B" {
				err = errors.New("not taken")
			}
			return err
		}},
		{"renew", func(ctx context.Context, svc *application.LockService, _ *application.Handle) error {
			_, err := svc.Renew(ctx, "A", plan1, ttl)
			return err
		}},
		{"renew by token", func(ctx context.Context, _ *application.LockService, held *application.Handle) error {
			_, err := held.Renew(ctx)
			return err
		}},
	}
	for _, batch := range []bool{false, true} {
		for _, w := range writes {
			t.Run(fmt.Sprintf("%s/batch=%v", w.name, batch), func(t *testing.T) {
				ctx := context.Background()
				server := newVirtualServer(t, start)
				db, err := postgres.Open(ctx, server.DSN, postgres.Options{})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, db.Close()) })
				host := newMockHost(start)
				sc, err := postgres.NewServerClock(ctx, db, host)
				require.NoError(t, err)
				defer sc.Close()
				repo := postgres.NewLockRepository(db)
				if batch {
					repo = repo.InBatches()
				}
				svc, err := application.NewLockService(repo, sc, 0)
				require.NoError(t, err)
				held, err := svc.Take(ctx, "A", plan1, application.AcquireOptions{TTL: ttl})
				require.NoError(t, err)
				_, err = svc.Acquire(ctx, "C", plan3, 5*time.Second)
				require.NoError(t, err)
				requireEstimate(t, server, sc, "at the start")

				server.Step(8 * time.Second) // C's lock has expired, on the server and by the estimate
				host.Add(5 * time.Second)    // which lags 3 s behind
				require.NoError(t, w.do(ctx, svc, held))
				requireEstimate(t, server, sc, "after the "+w.name)
			})
		}
	}
}

// The audit's case: a holder whose estimate lags 3 s kept its work
// context 3 s after the lock had expired on the server, while stating an
// uncertainty of microseconds. A renewal corrects the estimate: cut off
// from the server from then on, the holder ends its work context no later
// than the lock's expiry on the server's clock plus the uncertainty it
// states. A lag that arises while it is cut off (the server's clock steps
// forward) is added to that bound, and no more (docs/operations.md).
func TestServerClock_LaggingHolderEndsItsWorkInTime(t *testing.T) {
	for _, c := range []struct {
		name        string
		lag, cutLag time.Duration // before the last renewal, while cut off
	}{
		{"lag before the renewal", 3 * time.Second, 0},
		{"lag while cut off", 0, 3 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) { laggingHolder(t, c.lag, c.cutLag) })
	}
}

func laggingHolder(t *testing.T, lag, cutLag time.Duration) {
	const ttl = 10 * time.Second
	ctx := context.Background()
	start := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	server := newVirtualServer(t, start)
	db, err := postgres.Open(ctx, server.DSN, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	host := newMockHost(start)
	sc, err := postgres.NewServerClock(ctx, db, host)
	require.NoError(t, err)
	defer sc.Close()
	svc, err := application.NewLockService(postgres.NewLockRepository(db), sc, 0)
	require.NoError(t, err)

	h, err := svc.Take(ctx, "A", plan1, application.AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	work := h.KeepAlive(ctx)
	defer h.Release(ctx) //nolint:errcheck // lost by then

	server.Step(lag) // after the last measurement
	server.Step(ttl / 2)
	host.BlockUntil(t, 1) // the keep-alive waits for its renewal
	host.Add(ttl / 2)     // which is due
	first := h.Lock().ExpiresAt
	require.Eventually(t, func() bool { return h.Lock().ExpiresAt.After(first) }, 30*time.Second, time.Millisecond,
		"the keep-alive never renewed")
	expiry := h.Lock().ExpiresAt // on the server's clock
	_, uncertainty, err := sc.Offset()
	require.NoError(t, err)
	assert.InDelta(t, 0, float64(sc.Now().Sub(server.Now())), float64(uncertainty),
		"after the renewal, the host's estimate is off the server's time by more than the uncertainty it states")

	// Cut off: its writes wait (the lock table is held), as over a link
	// gone silent. Its next renewal starts and waits.
	admin := rawPG(t, server.DSN)
	tx, err := admin.Begin()
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // ends the cut
	_, err = tx.Exec("LOCK TABLE locks IN SHARE MODE")
	require.NoError(t, err)
	server.Step(ttl / 2)
	host.BlockUntil(t, 2) // the next renewal, and the last one's deadline, abandoned
	host.Add(ttl / 2)
	waitFor(t, admin, "wait_event_type = 'Lock' AND query LIKE '%UPDATE%'", "the next renewal never started")
	server.Step(cutLag)

	// Time passes on both until the server's clock reaches the bound: the
	// work context has ended by then.
	bound := expiry.Add(uncertainty + cutLag)
	left := bound.Sub(server.Now())
	server.Step(left)
	host.Add(left)
	require.Eventually(t, func() bool { return work.Err() != nil }, 10*time.Second, time.Millisecond,
		"the holder's work context outlived its lock on the server's clock (expired at %s, now %s) by more than the uncertainty %v it states and the lag %v that arose while it was cut off",
		expiry.Format(time.RFC3339Nano), server.Now().Format(time.RFC3339Nano), uncertainty, cutLag)
	var lost *domain.LockLostError
	require.ErrorAs(t, context.Cause(work), &lost)
}

// The review's break: an acquire sent before a measurement, held back by
// a table lock until after it, answers with the server's clock read after
// a 30 s step forward. Its reading came later than the measurement's:
// sent earlier is no reason to ignore it. Until a new measurement tells,
// the estimate states an uncertainty that covers the server's time; the
// measurement it asks for narrows it again.
func TestServerClock_ReadingSentBeforeAMeasurementAnsweredAfterIt(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	server := newVirtualServer(t, start)
	db, err := postgres.Open(ctx, server.DSN, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	host := newMockHost(start)
	sc, err := postgres.NewServerClock(ctx, db, host)
	require.NoError(t, err)
	defer sc.Close()
	svc, err := application.NewLockService(postgres.NewLockRepository(db), sc, 0)
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "A", plan1, time.Minute) // creates the table's first row
	require.NoError(t, err)

	admin := rawPG(t, server.DSN)
	tx, err := admin.Begin()
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // ends the hold
	_, err = tx.Exec("LOCK TABLE locks IN EXCLUSIVE MODE")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := svc.Acquire(ctx, "A", plan2, time.Minute)
		done <- err
	}()
	waitFor(t, admin, "wait_event_type = 'Lock'", "the acquire never waited")

	host.Add(time.Second) // both clocks run on; the measurement, sent after the acquire, agrees
	server.Step(time.Second)
	require.NoError(t, postgres.Measure(ctx, sc))
	requireEstimate(t, server, sc, "after the measurement")

	server.Step(30 * time.Second) // the server's clock steps while the acquire waits
	host.Add(time.Second)
	server.Step(time.Second)
	require.NoError(t, tx.Commit())
	require.NoError(t, <-done)
	requireEstimate(t, server, sc, "after the acquire that read the stepped clock")
	require.Eventually(t, func() bool {
		_, uncertainty, err := sc.Offset()
		return err == nil && uncertainty < time.Second && sc.Now().Sub(server.Now()).Abs() <= uncertainty
	}, 30*time.Second, 5*time.Millisecond, "no measurement narrowed the uncertainty back")
}
