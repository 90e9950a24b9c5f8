package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

func TestMigrationName_SameAsSQLite(t *testing.T) {
	assert.Equal(t, sqlite.MigrationName, postgres.MigrationName,
		"diagnostics names one migration whatever the database")
}

// relations lists every relation (table, index, sequence, view) in the
// schema that dsn's search_path names, with the rows of its tables, so
// that a test can tell whether anything was created or changed.
func relations(t *testing.T, dsn string) []string {
	t.Helper()
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer raw.Close()
	rows, err := raw.Query(`SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() ORDER BY 1`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var name, kind string
		require.NoError(t, rows.Scan(&name, &kind))
		out = append(out, name+" "+kind)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	for _, table := range []string{"locks", "goose_db_version", "locks_schema_version"} {
		var dump []string
		rows, err := raw.Query("SELECT t::text FROM " + table + " t ORDER BY 1")
		if err != nil {
			continue // no such table
		}
		for rows.Next() {
			var row string
			require.NoError(t, rows.Scan(&row))
			dump = append(dump, row)
		}
		require.NoError(t, rows.Err())
		rows.Close()
		out = append(out, table+": "+strings.Join(dump, "; "))
	}
	return out
}

func TestOpenReadOnly_EmptySchema(t *testing.T) {
	dsn := testdb.Postgres(t)
	db, err := postgres.OpenReadOnly(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	st, err := db.Schema(context.Background())
	require.NoError(t, err)
	assert.False(t, st.MigrationApplied)
	assert.False(t, st.LocksTable)
	assert.True(t, strings.HasPrefix(st.Schema, "locks_test_"), st.Schema)
	require.NoError(t, db.Close())
	assert.Empty(t, relations(t, dsn), "inspection created nothing: no goose version table, no locks table")
}

func TestOpenReadOnly_MigratedWithExpiredLocks(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	clk := clock.NewMock()
	clk.Set(time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC))
	rw, err := postgres.Open(ctx, dsn, postgres.Options{MaxConns: 2})
	require.NoError(t, err)
	svc, err := application.NewLockService(postgres.NewLockRepository(rw), clk, 0)
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "B", domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-2"}, time.Hour)
	require.NoError(t, err)
	require.NoError(t, rw.Close())
	clk.Add(time.Minute)
	before := relations(t, dsn)

	db, err := postgres.OpenReadOnly(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	st, err := db.Schema(ctx)
	require.NoError(t, err)
	assert.True(t, st.MigrationApplied)
	assert.True(t, st.LocksTable)

	ro, err := application.NewLockService(postgres.NewLockRepository(db), clk, 0)
	require.NoError(t, err)
	n, err := ro.StaleCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	ls, err := ro.List(ctx, application.ListOptions{})
	require.NoError(t, err)
	require.Len(t, ls, 1)
	assert.Equal(t, "B", ls[0].Owner)

	_, err = ro.Acquire(ctx, "C", domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-3"}, 0)
	assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
	_, err = ro.CleanupExpired(ctx)
	assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
	assert.Equal(t, before, relations(t, dsn), "inspection changed nothing")
}

func TestOpenReadOnly_HandMadeTable(t *testing.T) {
	dsn := testdb.Postgres(t)
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	_, err = raw.Exec("CREATE TABLE locks (id bigint PRIMARY KEY)")
	require.NoError(t, err)
	require.NoError(t, raw.Close())

	db, err := postgres.OpenReadOnly(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	st, err := db.Schema(context.Background())
	require.NoError(t, err)
	assert.True(t, st.LocksTable)
	assert.False(t, st.MigrationApplied)
}

func TestOpenReadOnly_NoSuchSchema(t *testing.T) {
	dsn := withParam(t, testdb.Postgres(t), "search_path", "locks_no_such_schema")
	db, err := postgres.OpenReadOnly(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	st, err := db.Schema(context.Background())
	require.NoError(t, err)
	assert.Equal(t, postgres.SchemaState{SearchPath: "locks_no_such_schema", User: st.User}, st,
		"no schema, and the search_path that names none")
	assert.NotEmpty(t, st.User)

	err = postgres.CheckWritable(context.Background(), dsn)
	assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
	assert.ErrorContains(t, err, "the search_path names no schema")
}

func TestOpenReadOnly_Unreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, dsn := range []string{
		"postgres://app:s3cret-pw@127.0.0.1:1/locks?sslmode=disable&connect_timeout=2",
		"postgres://app:s3cret%2fpw@127.0.0.1:1/locks?sslmode=disable&connect_timeout=2",
		"postgres://app@127.0.0.1:1/locks?sslmode=disable&connect_timeout=2&password=s3cret-pw",
	} {
		_, err := postgres.OpenReadOnly(ctx, dsn, postgres.Options{})
		require.ErrorIs(t, err, domain.ErrUnavailable, dsn)
		assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
		assert.NotContains(t, err.Error(), "s3cret")
		assert.Contains(t, err.Error(), "postgres://app@127.0.0.1:1/locks")

		err = postgres.CheckWritable(ctx, dsn)
		assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
		assert.NotContains(t, err.Error(), "s3cret")
	}
}

func TestCheckWritable(t *testing.T) {
	ctx := context.Background()
	t.Run("EmptySchema", func(t *testing.T) {
		// The migrations can create the table: writable.
		dsn := testdb.Postgres(t)
		require.NoError(t, postgres.CheckWritable(ctx, dsn))
		assert.Empty(t, relations(t, dsn))
	})
	t.Run("Migrated", func(t *testing.T) {
		dsn := MigratedDSN(t)
		before := relations(t, dsn)
		require.NoError(t, postgres.CheckWritable(ctx, dsn))
		assert.Equal(t, before, relations(t, dsn))
	})
	t.Run("ReadOnlyTransactions", func(t *testing.T) {
		dsn := withParam(t, MigratedDSN(t), "default_transaction_read_only", "on")
		err := postgres.CheckWritable(ctx, dsn)
		assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
		assert.ErrorContains(t, err, "default_transaction_read_only is on")
	})
	t.Run("NoPrivileges", func(t *testing.T) {
		dsn := MigratedDSN(t)
		role := scratchRole(t, dsn)
		schema := schemaOf(t, dsn)
		adminExec(t, dsn, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, UPDATE ON %s.locks TO %s", schema, role, schema, role))
		err := postgres.CheckWritable(ctx, asUser(t, dsn, role))
		assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
		assert.ErrorContains(t, err, fmt.Sprintf(`user %q lacks the INSERT, DELETE privilege on table %q.locks`, role, schema))
	})
	t.Run("NoCreateInEmptySchema", func(t *testing.T) {
		dsn := testdb.Postgres(t)
		role := scratchRole(t, dsn)
		schema := schemaOf(t, dsn)
		adminExec(t, dsn, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", schema, role))
		err := postgres.CheckWritable(ctx, asUser(t, dsn, role))
		assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
		assert.ErrorContains(t, err, "may not create one there")
	})
}

func TestOpenReadOnly_ConnectionsCannotWrite(t *testing.T) {
	// The DSN asks for read-write transactions in both ways it can; the
	// inspection's own setting wins, and a write the store would never
	// send is refused by the server. (See also the internal test.)
	dsn := MigratedDSN(t)
	// The options parameter does reach the server:
	err := postgres.CheckWritable(context.Background(), withParam(t, dsn, "options", "-c default_transaction_read_only=on"))
	require.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)

	dsn = withParam(t, dsn, "default_transaction_read_only", "off")
	dsn = withParam(t, dsn, "options", "-c default_transaction_read_only=off")
	db, err := postgres.OpenReadOnly(context.Background(), dsn, postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	require.True(t, postgres.ReadOnlySession(t, db))
}

// MigratedDSN returns a scratch schema with the migrations applied.
func MigratedDSN(t *testing.T) string {
	t.Helper()
	dsn := testdb.Postgres(t)
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{MaxConns: 1})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	return dsn
}

func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set(key, value)
	// libpq and pgx read '+' as itself, not as a space.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

func schemaOf(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return u.Query().Get("search_path")
}

func asUser(t *testing.T, dsn, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.User(user)
	return u.String()
}

func adminExec(t *testing.T, dsn, query string) {
	t.Helper()
	raw, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer raw.Close()
	_, err = raw.Exec(query)
	require.NoError(t, err, query)
}

var roles atomic.Int64

// scratchRole creates a login role with no privileges, dropped (with what
// was granted to it) when the test ends. The server must let it log in
// without a password, as the test server does.
func scratchRole(t *testing.T, dsn string) string {
	t.Helper()
	role := fmt.Sprintf("locks_test_role_%d_%d", os.Getpid(), roles.Add(1))
	adminExec(t, dsn, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() { adminExec(t, dsn, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	return role
}
