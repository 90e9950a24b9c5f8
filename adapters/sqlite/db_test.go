package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"entgo.io/ent/dialect/sql/schema"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"ariga.io/atlas/sql/migrate"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entmigrate "github.com/cleveragents/locks/ent/migrate"
)

var plan1 = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-1"}

func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=foreign_keys(1)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOpen_Migration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	for range 3 {
		db, err := sqlite.Open(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		st, err := db.Schema(ctx)
		require.NoError(t, err)
		assert.True(t, st.MigrationApplied)
		require.NoError(t, db.Close())
	}
	raw := rawDB(t, path)

	t.Run("AppliedOnce", func(t *testing.T) {
		var n int
		require.NoError(t, raw.QueryRow(`SELECT count(*) FROM locks_schema_version WHERE version_id > 0`).Scan(&n))
		assert.Equal(t, len(ourVersions(t))-1, n, "three opens record each migration once")
	})
	t.Run("ColumnsAsPublished", func(t *testing.T) {
		rows, err := raw.Query(`SELECT name, type, "notnull", pk FROM pragma_table_info('locks') ORDER BY cid`)
		require.NoError(t, err)
		defer rows.Close()
		type col struct {
			name, typ   string
			notnull, pk int
		}
		var got []col
		for rows.Next() {
			var c col
			require.NoError(t, rows.Scan(&c.name, &c.typ, &c.notnull, &c.pk))
			got = append(got, c)
		}
		assert.Equal(t, []col{
			{"id", "INTEGER", 1, 1},
			{"owner_id", "varchar(255)", 1, 0},
			{"resource_type", "varchar(50)", 1, 0},
			{"resource_id", "varchar(255)", 1, 0},
			{"acquired_at", "varchar(30)", 1, 0},
			{"expires_at", "varchar(30)", 1, 0},
			{"note", "varchar(256)", 0, 0}, // nullable: rows and writers of m4_001 stay valid
		}, got)
	})
	t.Run("Indexes", func(t *testing.T) {
		var unique int
		require.NoError(t, raw.QueryRow(`SELECT "unique" FROM pragma_index_list('locks') WHERE name = 'lock_resource_type_resource_id'`).Scan(&unique))
		assert.Equal(t, 1, unique)
		var plan string
		require.NoError(t, raw.QueryRow(`EXPLAIN QUERY PLAN SELECT count(*) FROM locks WHERE expires_at <= '2026'`).Scan(new(int), new(int), new(int), &plan))
		assert.Contains(t, plan, "lock_expires_at", "cleanup and the stale count use the index")
	})
	t.Run("MatchesEntSchema", func(t *testing.T) {
		// Ent finds nothing to change between the migrated database and
		// the schema in ent/: the committed migration is up to date.
		m, err := schema.NewMigrate(entsql.OpenDB(dialect.SQLite, raw),
			schema.WithDir(&migrate.MemDir{}), schema.WithMigrationMode(schema.ModeInspect),
			schema.WithDialect(dialect.SQLite), schema.WithErrNoPlan(true))
		require.NoError(t, err)
		err = m.NamedDiff(ctx, "check", entmigrate.Tables...)
		require.ErrorIs(t, err, migrate.ErrNoPlan, "run go run ./adapters/sqlite/migrations/diff.go NAME")
	})
}

func TestOpen_ConcurrentFirstOpen(t *testing.T) {
	// Processes starting together on a new file race to migrate it.
	path := filepath.Join(t.TempDir(), "locks.db")
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
			if err == nil {
				err = db.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

func TestOpen_Errors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Run("MissingDirectory", func(t *testing.T) {
		_, err := sqlite.Open(ctx, filepath.Join(dir, "nope", "locks.db"), sqlite.Options{})
		require.ErrorIs(t, err, domain.ErrUnavailable)
		assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
		assert.Contains(t, err.Error(), "directory exists")
	})
	t.Run("NotADatabase", func(t *testing.T) {
		path := filepath.Join(dir, "notes.txt")
		content := []byte("these are not the pages you are looking for\n" + string(make([]byte, 4096)))
		require.NoError(t, os.WriteFile(path, content, 0o600))
		_, err := sqlite.Open(ctx, path, sqlite.Options{})
		require.ErrorIs(t, err, domain.ErrUnavailable)
		assert.True(t, domain.IsStoreKind(err, domain.StoreCorrupt), "%v", err)
		after, rerr := os.ReadFile(path)
		require.NoError(t, rerr)
		assert.Equal(t, content, after, "the file is left as it was")
	})
	t.Run("ReadOnly", func(t *testing.T) {
		path := filepath.Join(dir, "ro.db")
		db, err := sqlite.Open(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		require.NoError(t, db.Close())
		ro, err := sqlite.Open(ctx, "file:"+path+"?mode=ro", sqlite.Options{})
		if err == nil {
			defer ro.Close()
			svc, serr := application.NewLockService(sqlite.NewLockRepository(ro), clock.New(), 0)
			require.NoError(t, serr)
			_, err = svc.Acquire(ctx, "A", plan1, 0)
		}
		require.ErrorIs(t, err, domain.ErrUnavailable)
		assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
	})
	t.Run("ImmutableCreatesNothing", func(t *testing.T) {
		// immutable=1 is read-only too: refused before anything is
		// created (it used to leave an empty file where there was none).
		path := filepath.Join(dir, "immutable.db")
		_, err := sqlite.Open(ctx, "file:"+path+"?immutable=1", sqlite.Options{})
		require.ErrorIs(t, err, domain.ErrUnavailable)
		assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
		assert.Contains(t, err.Error(), "drop immutable=1 from the URI")
		assert.NoFileExists(t, path)
	})
}

func TestLockRepository_Busy(t *testing.T) {
	// Another process holds the write lock for longer than the busy timeout
	// and every retry: the caller gets a typed, explained error, not a raw
	// "database is locked", and the lock is not reported as held.
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{BusyTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	defer db.Close()

	blocker := rawDB(t, path)
	conn, err := blocker.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)

	svc, err := application.NewLockService(sqlite.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "A", plan1, 0)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.True(t, domain.IsStoreKind(err, domain.StoreBusy), "%v", err)
	assert.Contains(t, err.Error(), "retry later")

	_, err = conn.ExecContext(ctx, "ROLLBACK")
	require.NoError(t, err)
	_, err = svc.Get(ctx, plan1)
	require.ErrorIs(t, err, domain.ErrNotFound, "nothing was written")
	_, err = svc.Acquire(ctx, "A", plan1, 0)
	require.NoError(t, err, "works again once the writer is gone")
}

func TestLockRepository_StoredForm(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer db.Close()
	at := time.Date(2026, 3, 4, 5, 6, 7, 891234567, time.FixedZone("CET", 3600))
	mc := clock.NewMock()
	mc.Set(at)
	svc, err := application.NewLockService(sqlite.NewLockRepository(db), mc, 0)
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)

	var acquired, expires string
	require.NoError(t, rawDB(t, path).QueryRow(`SELECT acquired_at, expires_at FROM locks`).Scan(&acquired, &expires))
	assert.Equal(t, "2026-03-04T04:06:07.891234Z", acquired, "UTC, microseconds, fixed width")
	assert.Equal(t, "2026-03-04T04:06:12.891234Z", expires)
}

func TestLockRepository_TokensSurviveRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	var last int64
	for i := range 3 {
		db, err := sqlite.Open(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		svc, err := application.NewLockService(sqlite.NewLockRepository(db), clock.New(), 0)
		require.NoError(t, err)
		l, err := svc.Acquire(ctx, "A", plan1, 0)
		require.NoError(t, err)
		assert.Greater(t, l.Token, last, "restart %d", i)
		last = l.Token
		_, err = svc.Release(ctx, "A", plan1)
		require.NoError(t, err)
		require.NoError(t, db.Close())
	}
}

func TestLockRepository_SeparateHandles(t *testing.T) {
	// Several handles on one file behave like several processes: SQLite's
	// file locks, not the in-process writer queue, must keep them apart.
	path := filepath.Join(t.TempDir(), "locks.db")
	const handles = 4
	var repos []application.LockRepository
	for range handles {
		db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		repos = append(repos, sqlite.NewLockRepository(db))
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners int
		start   = make(chan struct{})
	)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			svc, err := application.NewLockService(repos[i%handles], clock.New(), 0)
			if !assert.NoError(t, err) {
				return
			}
			<-start
			_, err = svc.Acquire(context.Background(), "owner-"+string(rune('a'+i)), plan1, 0)
			switch {
			case err == nil:
				mu.Lock()
				winners++
				mu.Unlock()
			case !errors.Is(err, domain.ErrConflict):
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, 1, winners)
}
