package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/adapters/sqlite"
)

// versionTable is the module's own goose version table. Operators and
// embedding applications rely on its name (docs/operations.md), so the
// tests spell it out rather than use the constant.
const versionTable = "locks_schema_version"

// Versions of an embedding application's own migrations, around ours
// (20261129190022).
const (
	appBehind     = 20250101000000
	appNextBehind = 20250201000000
	appAhead      = 20300101000000
)

// appMigrate applies an embedding application's migrations, one table
// each, with goose's defaults: its version table is goose_db_version.
func appMigrate(t *testing.T, db *sql.DB, versions ...int64) error {
	t.Helper()
	fsys := fstest.MapFS{}
	for _, v := range versions {
		fsys[fmt.Sprintf("%d_app.sql", v)] = &fstest.MapFile{
			Data: fmt.Appendf(nil, "-- +goose Up\nCREATE TABLE app_%d (id integer);\n", v)}
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, fsys)
	require.NoError(t, err)
	_, err = p.Up(context.Background())
	return err
}

// oldMigrate migrates db as the module did before it kept its own version
// table: our migrations of then (the first), recorded in goose_db_version.
func oldMigrate(t *testing.T, db *sql.DB) {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("migrations/%d_*.sql", ourVersion(t)))
	require.NoError(t, err)
	fsys := fstest.MapFS{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		fsys[filepath.Base(f)] = &fstest.MapFile{Data: data}
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, fsys)
	require.NoError(t, err)
	_, err = p.Up(context.Background())
	require.NoError(t, err)
}

// ourVersion is the goose version of the migration that creates the locks
// table.
func ourVersion(t *testing.T) int64 {
	t.Helper()
	v, err := entstore.MigrationVersion(os.DirFS("migrations"), sqlite.MigrationName)
	require.NoError(t, err)
	return v
}

// ourVersions is what a database of this version records in its version
// table: version 0, then each of our migrations, applied.
func ourVersions(t *testing.T) []string {
	t.Helper()
	vs, err := entstore.MigrationVersions(os.DirFS("migrations"))
	require.NoError(t, err)
	out := []string{"0 true"}
	for _, v := range vs {
		out = append(out, fmt.Sprint(v, " true"))
	}
	return out
}

// versionRows returns the rows of a goose version table, in order, as
// "version applied"; nil when the table does not exist.
func versionRows(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", table).Scan(&n))
	if n == 0 {
		return nil
	}
	rows, err := db.Query("SELECT version_id, is_applied FROM " + table + " ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v int64
		var applied bool
		require.NoError(t, rows.Scan(&v, &applied))
		out = append(out, fmt.Sprint(v, " ", applied))
	}
	require.NoError(t, rows.Err())
	return out
}

func mustOpen(t *testing.T, path string) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
}

func TestOpen_VersionTable(t *testing.T) {
	ours := ourVersions(t)

	t.Run("AppAhead", func(t *testing.T) {
		// The application's migrations are newer than ours: goose would
		// call ours missing (out of order) if they shared a table.
		path := filepath.Join(t.TempDir(), "locks.db")
		raw := rawDB(t, path)
		require.NoError(t, appMigrate(t, raw, appAhead))
		before := versionRows(t, raw, goose.DefaultTablename)

		mustOpen(t, path)
		assert.Equal(t, before, versionRows(t, raw, goose.DefaultTablename), "the application's table is untouched")
		assert.Equal(t, ours, versionRows(t, raw, versionTable))
		require.NoError(t, appMigrate(t, raw, appAhead), "the application still finds nothing amiss")
	})

	t.Run("AppBehind", func(t *testing.T) {
		// The application's next migration is older than ours: it must
		// still apply after the module opened the database.
		path := filepath.Join(t.TempDir(), "locks.db")
		raw := rawDB(t, path)
		require.NoError(t, appMigrate(t, raw, appBehind))
		mustOpen(t, path)
		require.NoError(t, appMigrate(t, raw, appBehind, appNextBehind))
		assert.Equal(t, []string{"0 true", fmt.Sprint(appBehind, " true"), fmt.Sprint(appNextBehind, " true")},
			versionRows(t, raw, goose.DefaultTablename))
		assert.Equal(t, ours, versionRows(t, raw, versionTable))
	})

	t.Run("ExistingInstall", func(t *testing.T) {
		// A database migrated by an earlier version of the module, which
		// recorded its migration in goose_db_version, keeps its locks and
		// is not migrated again: its history is adopted, once.
		path := filepath.Join(t.TempDir(), "locks.db")
		raw := rawDB(t, path)
		require.NoError(t, appMigrate(t, raw, appBehind))
		oldMigrate(t, raw)
		_, err := raw.Exec(`INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at)
			VALUES ('A', 'plan', 'p1', '2026-01-01T00:00:00.000Z', '2999-01-01T00:00:00.000Z')`)
		require.NoError(t, err)
		before := versionRows(t, raw, goose.DefaultTablename)

		for range 2 {
			mustOpen(t, path)
		}
		assert.Equal(t, ours, versionRows(t, raw, versionTable))
		assert.Equal(t, before, versionRows(t, raw, goose.DefaultTablename), "the application's rows are left alone")
		var n int
		require.NoError(t, raw.QueryRow("SELECT count(*) FROM locks WHERE owner_id = 'A'").Scan(&n))
		assert.Equal(t, 1, n, "the lock stored before the upgrade is still there")
	})

	t.Run("ExistingInstallOpenedByManyAtOnce", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "locks.db")
		raw := rawDB(t, path)
		oldMigrate(t, raw)
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Go(func() {
				db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
				if err == nil {
					err = db.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		assert.Equal(t, ours, versionRows(t, raw, versionTable), "adopted once")
	})

	t.Run("LocksTableDroppedIsMigratedAgain", func(t *testing.T) {
		// goose_db_version records our migration, but the locks table is
		// gone: nothing to adopt, so the migration runs.
		path := filepath.Join(t.TempDir(), "locks.db")
		raw := rawDB(t, path)
		oldMigrate(t, raw)
		_, err := raw.Exec("DROP TABLE locks")
		require.NoError(t, err)
		mustOpen(t, path)
		assert.Equal(t, ours, versionRows(t, raw, versionTable))
		var n int
		require.NoError(t, raw.QueryRow("SELECT count(*) FROM sqlite_master WHERE name = 'locks'").Scan(&n))
		assert.Equal(t, 1, n)
	})
}

func TestDB_Schema_VersionTables(t *testing.T) {
	ctx := context.Background()
	schema := func(t *testing.T, path string) sqlite.SchemaState {
		t.Helper()
		db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer db.Close()
		st, err := db.Schema(ctx)
		require.NoError(t, err)
		return st
	}
	t.Run("ExistingInstallNotYetOpened", func(t *testing.T) {
		// Diagnostics run before the upgraded service first opens it: the
		// migration is applied, as goose_db_version records.
		path := filepath.Join(t.TempDir(), "locks.db")
		oldMigrate(t, rawDB(t, path))
		assert.Equal(t, sqlite.SchemaState{MigrationApplied: true, LocksTable: true}, schema(t, path))
	})
	t.Run("ApplicationTableOnly", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "locks.db")
		require.NoError(t, appMigrate(t, rawDB(t, path), appAhead))
		st := schema(t, path)
		assert.False(t, st.MigrationApplied)
		assert.False(t, st.LocksTable)
		assert.NotEmpty(t, st.OtherTables, "the application's own table")
	})
	t.Run("OwnTableOnly", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "locks.db")
		mustOpen(t, path)
		raw := rawDB(t, path)
		var n int
		require.NoError(t, raw.QueryRow("SELECT count(*) FROM sqlite_master WHERE name = ?", goose.DefaultTablename).Scan(&n))
		require.Zero(t, n, "a new store leaves goose's default table to the application")
		assert.Equal(t, sqlite.SchemaState{MigrationApplied: true, LocksTable: true}, schema(t, path))
	})
}
