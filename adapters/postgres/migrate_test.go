package postgres_test

import (
	"context"
	"database/sql"
	"errors"
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
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// versionTable is the module's own goose version table. Operators and
// embedding applications rely on its name (docs/operations.md), so the
// tests spell it out rather than use the constant.
const versionTable = "locks_schema_version"

// Versions of an embedding application's own migrations, around ours
// (20261129194850).
const (
	appBehind     = 20250101000000
	appNextBehind = 20250201000000
	appAhead      = 20300101000000
)

func rawPG(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// appMigrate applies an embedding application's migrations, one table
// each, with goose's defaults: its version table is goose_db_version in
// the current schema.
func appMigrate(t *testing.T, db *sql.DB, versions ...int64) error {
	t.Helper()
	fsys := fstest.MapFS{}
	for _, v := range versions {
		fsys[fmt.Sprintf("%d_app.sql", v)] = &fstest.MapFile{
			Data: fmt.Appendf(nil, "-- +goose Up\nCREATE TABLE app_%d (id integer);\n", v)}
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys)
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
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys)
	require.NoError(t, err)
	_, err = p.Up(context.Background())
	require.NoError(t, err)
}

func ourVersion(t *testing.T) int64 {
	t.Helper()
	v, err := entstore.MigrationVersion(os.DirFS("migrations"), postgres.MigrationName)
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

// versionRows returns the rows of a goose version table of the current
// schema, in order, as "version applied"; nil when there is no such table.
func versionRows(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	var exists bool
	require.NoError(t, db.QueryRow(`SELECT to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) IS NOT NULL`,
		table).Scan(&exists))
	if !exists {
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

func mustOpen(t *testing.T, dsn string) {
	t.Helper()
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
}

func TestOpen_VersionTable(t *testing.T) {
	testdb.Postgres(t)
	ours := ourVersions(t)

	t.Run("AppAhead", func(t *testing.T) {
		// The application's migrations are newer than ours: goose would
		// call ours missing (out of order) if they shared a table.
		dsn := testdb.Postgres(t)
		raw := rawPG(t, dsn)
		require.NoError(t, appMigrate(t, raw, appAhead))
		before := versionRows(t, raw, goose.DefaultTablename)

		mustOpen(t, dsn)
		assert.Equal(t, before, versionRows(t, raw, goose.DefaultTablename), "the application's table is untouched")
		assert.Equal(t, ours, versionRows(t, raw, versionTable))
		require.NoError(t, appMigrate(t, raw, appAhead), "the application still finds nothing amiss")
	})

	t.Run("AppBehind", func(t *testing.T) {
		// The application's next migration is older than ours: it must
		// still apply after the module opened the database.
		dsn := testdb.Postgres(t)
		raw := rawPG(t, dsn)
		require.NoError(t, appMigrate(t, raw, appBehind))
		mustOpen(t, dsn)
		require.NoError(t, appMigrate(t, raw, appBehind, appNextBehind))
		assert.Equal(t, []string{"0 true", fmt.Sprint(appBehind, " true"), fmt.Sprint(appNextBehind, " true")},
			versionRows(t, raw, goose.DefaultTablename))
		assert.Equal(t, ours, versionRows(t, raw, versionTable))
	})

	t.Run("ExistingInstall", func(t *testing.T) {
		// A schema migrated by an earlier version of the module, which
		// recorded its migration in goose_db_version, keeps its locks and
		// is not migrated again: its history is adopted, once.
		dsn := testdb.Postgres(t)
		raw := rawPG(t, dsn)
		require.NoError(t, appMigrate(t, raw, appBehind))
		oldMigrate(t, raw)
		_, err := raw.Exec(`INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at)
			VALUES ('A', 'plan', 'p1', '2026-01-01T00:00:00.000Z', '2999-01-01T00:00:00.000Z')`)
		require.NoError(t, err)
		before := versionRows(t, raw, goose.DefaultTablename)

		for range 2 {
			mustOpen(t, dsn)
		}
		assert.Equal(t, ours, versionRows(t, raw, versionTable))
		assert.Equal(t, before, versionRows(t, raw, goose.DefaultTablename), "the application's rows are left alone")
		var n int
		require.NoError(t, raw.QueryRow("SELECT count(*) FROM locks WHERE owner_id = 'A'").Scan(&n))
		assert.Equal(t, 1, n, "the lock stored before the upgrade is still there")
	})

	t.Run("ExistingInstallOpenedByManyAtOnce", func(t *testing.T) {
		dsn := testdb.Postgres(t)
		raw := rawPG(t, dsn)
		oldMigrate(t, raw)
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Go(func() {
				db, err := postgres.Open(context.Background(), dsn, postgres.Options{})
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
}

// withSearchPath returns the test server's DSN with search_path set to
// path.
func withSearchPath(t *testing.T, path string) string {
	t.Helper()
	return withParam(t, os.Getenv(testdb.EnvPostgres), "search_path", path)
}

func TestOpen_SearchPath(t *testing.T) {
	// Another schema holds a migrated lock store, with both the module's
	// and goose's default version tables.
	other := testdb.Postgres(t)
	oldMigrate(t, rawPG(t, other))
	mustOpen(t, other)
	schema := schemaOf(t, other)
	missing := fmt.Sprintf("locks_missing_%d", os.Getpid())

	t.Run("NoSchemaExists", func(t *testing.T) {
		// No schema of the search_path exists: there is no current schema,
		// and no lookup may find the other schema's tables instead.
		before := relations(t, other)
		_, err := postgres.Open(context.Background(), withSearchPath(t, missing), postgres.Options{})
		var se *domain.StoreError
		require.True(t, errors.As(err, &se), "%v", err)
		assert.Contains(t, err.Error(), "search_path")
		assert.Contains(t, err.Error(), missing)
		assert.Contains(t, err.Error(), "create the schema")
		assert.Equal(t, before, relations(t, other), "the other schema is untouched")
	})

	t.Run("FirstSchemaMissing", func(t *testing.T) {
		// The first schema of the search_path that exists is the current
		// one: the store lives there, as it always has.
		dsn := testdb.Postgres(t)
		mustOpen(t, withSearchPath(t, missing+", "+schemaOf(t, dsn)))
		raw := rawPG(t, dsn)
		assert.Equal(t, ourVersions(t), versionRows(t, raw, versionTable))
		assert.Nil(t, versionRows(t, raw, goose.DefaultTablename))
		assert.NotEqual(t, schema, schemaOf(t, dsn))
	})
}

func TestDB_Schema_VersionTables(t *testing.T) {
	ctx := context.Background()
	schema := func(t *testing.T, dsn string) postgres.SchemaState {
		t.Helper()
		db, err := postgres.OpenReadOnly(ctx, dsn, postgres.Options{})
		require.NoError(t, err)
		defer db.Close()
		st, err := db.Schema(ctx)
		require.NoError(t, err)
		return st
	}
	t.Run("ExistingInstallNotYetOpened", func(t *testing.T) {
		// Diagnostics run before the upgraded service first opens it: the
		// migration is applied, as goose_db_version records.
		dsn := testdb.Postgres(t)
		oldMigrate(t, rawPG(t, dsn))
		st := schema(t, dsn)
		assert.True(t, st.MigrationApplied)
		assert.True(t, st.LocksTable)
	})
	t.Run("ApplicationTableOnly", func(t *testing.T) {
		dsn := testdb.Postgres(t)
		require.NoError(t, appMigrate(t, rawPG(t, dsn), appAhead))
		st := schema(t, dsn)
		assert.False(t, st.MigrationApplied)
		assert.False(t, st.LocksTable)
	})
	t.Run("OwnTableOnly", func(t *testing.T) {
		dsn := testdb.Postgres(t)
		mustOpen(t, dsn)
		assert.Nil(t, versionRows(t, rawPG(t, dsn), goose.DefaultTablename),
			"a new store leaves goose's default table to the application")
		st := schema(t, dsn)
		assert.True(t, st.MigrationApplied)
		assert.True(t, st.LocksTable)
	})
}
