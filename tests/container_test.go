// Package tests holds the end-to-end tests of the module as an embedder
// uses it: through locks.Open and the container's lock service.
package tests

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

var (
	plan1    = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-1"}
	project1 = domain.ResourceRef{Type: domain.ResourceProject, ID: "project-1"}
)

// MustOpen opens a container and closes it when the test ends (a second
// Close is harmless).
func MustOpen(tb testing.TB, cfg locks.Config) *locks.Container {
	tb.Helper()
	c, err := locks.Open(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

func newMock() *clock.Mock {
	mc := clock.NewMock()
	mc.Set(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	return mc
}

func allLocks(t *testing.T, c *locks.Container) []domain.Lock {
	t.Helper()
	l, err := c.Locks.List(context.Background(), application.ListOptions{IncludeExpired: true})
	require.NoError(t, err)
	return l
}

func TestContainer_CloseReleasesOwnersLocks(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) { testCloseReleases(t, filepath.Join(t.TempDir(), "agents.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { testCloseReleases(t, testdb.Postgres(t)) })
}

func testCloseReleases(t *testing.T, db string) {
	ctx := context.Background()
	mc := newMock()

	other := MustOpen(t, locks.Config{Database: db, Owner: "B", Clock: mc, LocalTime: true})
	kept, err := other.Locks.Acquire(ctx, other.Owner(), project1, 0)
	require.NoError(t, err)

	a := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: mc, LocalTime: true})
	for _, ref := range []domain.ResourceRef{plan1, {Type: domain.ResourcePlan, ID: "plan-2"}} {
		_, err := a.Locks.Acquire(ctx, a.Owner(), ref, 0)
		require.NoError(t, err)
	}
	require.Len(t, allLocks(t, other), 3)

	require.NoError(t, a.Close())
	assert.Equal(t, []domain.Lock{kept}, allLocks(t, other), "A's locks are gone, B's stay")
	_, err = other.Locks.Acquire(ctx, other.Owner(), plan1, 0)
	require.NoError(t, err, "A's resource is free at once, without waiting for its TTL")
	require.NoError(t, a.Close(), "closing twice is harmless")
}

func TestContainer_KeepLocksOnClose(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	a := MustOpen(t, locks.Config{Database: db, Owner: "A", KeepLocksOnClose: true})
	_, err := a.Locks.Acquire(ctx, "A", plan1, 0)
	require.NoError(t, err)
	require.NoError(t, a.Close())

	b := MustOpen(t, locks.Config{Database: db, Owner: "B"})
	_, err = b.Locks.Acquire(ctx, "B", plan1, 0)
	require.ErrorIs(t, err, domain.ErrConflict)
}

func TestContainer_OpenPurgesExpiredLocks(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	mc := newMock()

	// A process takes locks and dies without closing its container.
	crashed := MustOpen(t, locks.Config{Database: db, Owner: "crashed", Clock: mc, LocalTime: true, KeepLocksOnClose: true})
	_, err := crashed.Locks.Acquire(ctx, "crashed", plan1, 10*time.Second)
	require.NoError(t, err)
	live, err := crashed.Locks.Acquire(ctx, "crashed", project1, time.Hour)
	require.NoError(t, err)

	mc.Add(10 * time.Second)
	stale, err := crashed.Locks.StaleCount(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, stale)

	next := MustOpen(t, locks.Config{Database: db, Owner: "next", Clock: mc, LocalTime: true})
	assert.Equal(t, []domain.Lock{live}, allLocks(t, next), "the expired lock was purged on open, the live one kept")
	stale, err = next.Locks.StaleCount(ctx)
	require.NoError(t, err)
	assert.Zero(t, stale)
}

func TestContainer_SkipStartupCleanup(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	mc := newMock()
	a := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: mc, LocalTime: true, KeepLocksOnClose: true})
	_, err := a.Locks.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	mc.Add(time.Minute)

	inspect := MustOpen(t, locks.Config{Database: db, Clock: mc, LocalTime: true, SkipStartupCleanup: true, KeepLocksOnClose: true})
	n, err := inspect.Locks.StaleCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

func TestContainer_RacingGoroutinesOneWinner(t *testing.T) {
	for _, db := range []string{locks.MemoryDatabase, "file", "postgres"} {
		t.Run(db, func(t *testing.T) {
			switch db {
			case "file":
				db = filepath.Join(t.TempDir(), "agents.db")
			case "postgres":
				db = testdb.Postgres(t)
			}
			c := MustOpen(t, locks.Config{Database: db})
			const racers = 32
			var (
				wg      sync.WaitGroup
				start   = make(chan struct{})
				mu      sync.Mutex
				winners []string
			)
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					owner := c.Owner() + "/worker-" + string(rune('A'+i))
					<-start
					_, err := c.Locks.Acquire(context.Background(), owner, plan1, 0)
					if err == nil {
						mu.Lock()
						winners = append(winners, owner)
						mu.Unlock()
					} else if !errors.Is(err, domain.ErrConflict) {
						t.Errorf("%s: %v", owner, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			require.Len(t, winners, 1)
		})
	}
}

func TestContainer_Config(t *testing.T) {
	ctx := context.Background()
	t.Run("DatabaseRequired", func(t *testing.T) {
		_, err := locks.Open(ctx, locks.Config{})
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "database", ve.Field)
	})
	t.Run("InMemorySQLiteURI", func(t *testing.T) {
		// The reader pool and the writer would each open a database of
		// their own: the error must point to MemoryDatabase instead.
		for _, db := range []string{"file::memory:", "file::memory:?cache=shared", "file:x?mode=memory"} {
			_, err := locks.Open(ctx, locks.Config{Database: db})
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve, db)
			assert.Equal(t, "database", ve.Field)
			assert.Contains(t, ve.Reason, "locks.MemoryDatabase")
		}
	})
	t.Run("BadOwner", func(t *testing.T) {
		_, err := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase, Owner: " "})
		require.ErrorIs(t, err, domain.ErrValidation)
	})
	t.Run("BadDefaultTTL", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "agents.db")
		_, err := locks.Open(ctx, locks.Config{Database: db, DefaultTTL: 2 * time.Hour})
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "ttl", ve.Field)
	})
	t.Run("DefaultTTL", func(t *testing.T) {
		mc := newMock()
		c := MustOpen(t, locks.Config{Database: locks.MemoryDatabase, DefaultTTL: time.Minute, Clock: mc, LocalTime: true})
		l, err := c.Locks.Acquire(ctx, c.Owner(), plan1, 0)
		require.NoError(t, err)
		assert.Equal(t, mc.Now().Add(time.Minute), l.ExpiresAt)
	})
	t.Run("DefaultOwnerIdentifiesProcess", func(t *testing.T) {
		a := MustOpen(t, locks.Config{Database: locks.MemoryDatabase})
		b := MustOpen(t, locks.Config{Database: locks.MemoryDatabase})
		assert.NotEqual(t, a.Owner(), b.Owner(), "a random suffix tells containers apart")
		require.NoError(t, domain.ValidateOwner(a.Owner()))
	})
	t.Run("UnreachableDatabase", func(t *testing.T) {
		_, err := locks.Open(ctx, locks.Config{Database: filepath.Join(t.TempDir(), "missing", "agents.db")})
		require.ErrorIs(t, err, domain.ErrUnavailable)
	})
}

func TestIsPostgres(t *testing.T) {
	for db, want := range map[string]bool{
		"postgres://h/db":              true,
		"postgresql://u@h/db":          true,
		"host=db user=app password=pw": true,
		"dbname=agents":                true,
		// libpq's form allows spaces around "=", quoted values, and any
		// of its keywords first.
		"host = 127.0.0.1 dbname = test":                 true,
		"target_session_attrs=read-write host=127.0.0.1": true,
		"options=-csearch_path=x host=127.0.0.1":         true,
		"sslrootcert=/etc/ca.pem host=db":                true,
		"search_path=x host=db":                          true,
		"password='a b' host=db":                         true,
		`host=127.0.0.1 password=a\ b dbname=test`:       true,
		"my notes.db":                       false,
		"/var/lib/agents/a=b.db":            false,
		"agents.db":                         false,
		"file:agents.db?_busy_timeout=9000": false,
		"/var/lib/agents/host=1.db":         false,
		locks.MemoryDatabase:                false,
		"":                                  false,
	} {
		assert.Equal(t, want, locks.IsPostgres(db), db)
	}
}

func TestContainer_PeriodicCleanup(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) { testPeriodicCleanup(t, filepath.Join(t.TempDir(), "agents.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { testPeriodicCleanup(t, testdb.Postgres(t)) })
	t.Run("Memory", func(t *testing.T) { testPeriodicCleanup(t, locks.MemoryDatabase) })

	t.Run("OffByDefault", func(t *testing.T) {
		mc := newMock()
		c := MustOpen(t, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db"), Clock: mc, LocalTime: true})
		_, err := c.Locks.Acquire(context.Background(), "crashed", plan1, domain.MinLockTTL)
		require.NoError(t, err)
		mc.Add(24 * time.Hour)
		n, err := c.Locks.StaleCount(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 1, n, "without CleanupInterval, only the startup cleanup purges")
	})

	t.Run("IntervalValidated", func(t *testing.T) {
		for _, d := range []time.Duration{-time.Minute, time.Second, application.MinCleanupInterval - 1} {
			db := filepath.Join(t.TempDir(), "agents.db")
			_, err := locks.Open(context.Background(), locks.Config{Database: db, CleanupInterval: d})
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve, d)
			assert.Equal(t, "cleanup_interval", ve.Field)
			assert.NoFileExists(t, db, "bad input writes nothing")
		}
	})
}

// testPeriodicCleanup opens a container that cleans up every minute and
// closes it itself, so that goleak can check that Close ended the loop.
func testPeriodicCleanup(t *testing.T, db string) {
	before := goleak.IgnoreCurrent()
	ctx := context.Background()
	mc := newMock()
	type run struct {
		purged int
		err    error
	}
	runs := make(chan run, 10)
	c, err := locks.Open(ctx, locks.Config{Database: db, Owner: "A", Clock: mc, LocalTime: true,
		CleanupInterval: time.Minute, OnCleanup: func(n int, err error) { runs <- run{n, err} }})
	require.NoError(t, err)
	defer c.Close()
	stale := func() int {
		n, err := c.Locks.StaleCount(ctx)
		require.NoError(t, err)
		return n
	}

	// A lock of a process that died expires 5 s into the interval.
	_, err = c.Locks.Acquire(ctx, "crashed", plan1, domain.MinLockTTL)
	require.NoError(t, err)
	mc.Add(domain.MinLockTTL)
	require.Equal(t, 1, stale())
	mc.Add(time.Minute - domain.MinLockTTL - time.Microsecond)
	require.Empty(t, runs, "no cleanup before the interval")
	require.Equal(t, 1, stale())

	mc.Add(time.Microsecond)
	select {
	case r := <-runs:
		require.Equal(t, run{purged: 1}, r)
	case <-time.After(10 * time.Second): // a guard against a hang, not a wait for time to pass
		t.Fatal("no cleanup ran after the interval passed")
	}
	require.Equal(t, 0, stale())

	require.NoError(t, c.Close())
	// Checked before the clock moves again: a loop still waiting for its
	// next run would end there, on the closed service, and hide the leak.
	goleak.VerifyNone(t, before)
	mc.Add(time.Hour)
	require.Empty(t, runs, "nothing runs after Close")
}
