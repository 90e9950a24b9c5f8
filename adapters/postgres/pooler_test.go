package postgres_test

import (
	"context"
	"database/sql"
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

// viaPooler returns a plain pool through the PgBouncer of dsn, on the
// simple protocol (which every pool mode carries) and without dsn's
// search_path (which PgBouncer refuses at startup), and that schema.
func viaPooler(t *testing.T, dsn string) (*sql.DB, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	schema := q.Get("search_path")
	q.Del("search_path")
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, schema
}

// Behind PgBouncer in session mode, which refuses at startup the run-time
// parameters that the store sends (and the DSN's search_path), the store
// opens, sends them once each connection is made instead, and works:
// the migrations create the locks table in the DSN's search_path, locks
// change hands, the wake-up listener connects, and an inspection's
// connections are read-only.
func TestPgBouncer_SessionMode(t *testing.T) {
	dsn := testdb.PgBouncer(t, testdb.EnvPgBouncerSession)
	ctx := context.Background()
	admin, schema := viaPooler(t, dsn)

	open := func() *postgres.DB {
		db, err := postgres.Open(ctx, dsn, postgres.Options{})
		require.NoError(t, err, "Open through PgBouncer in session mode")
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		return db
	}
	a, b := open(), open()
	held := acquire(t, a, plan1, "A")
	var owner string
	require.NoError(t, admin.QueryRow("SELECT owner_id FROM "+schema+".locks").Scan(&owner),
		"the locks table is in the search_path's schema")
	assert.Equal(t, "A", owner)

	// The wake-ups: B's listener hears A's release, through the pooler.
	c, stop := b.Wakeups().Watch(plan1)
	defer stop()
	postgres.AwaitListener(t, b, "the watch to be in force through the pooler", func() bool { return postgres.Watching(b, plan1) })
	drain(c)
	ok, err := postgres.NewLockRepository(a).DeleteOwned(ctx, plan1, "A")
	require.NoError(t, err)
	require.True(t, ok)
	woken(t, c, "a release through the pooler")

	svc, err := application.NewLockService(postgres.NewLockRepository(b), clock.New(), 0)
	require.NoError(t, err)
	l, err := svc.Acquire(ctx, "B", plan1, 30*time.Second)
	require.NoError(t, err)
	assert.Greater(t, l.Token, held.Token)

	ro, err := postgres.OpenReadOnly(ctx, dsn, postgres.Options{})
	require.NoError(t, err, "an inspection's connections are made read-only through the pooler too")
	defer ro.Close()
	st, err := ro.Schema(ctx)
	require.NoError(t, err)
	assert.True(t, st.MigrationApplied && st.LocksTable, "%+v", st)
	assert.Equal(t, schema, st.Schema)
	require.NoError(t, postgres.CheckWritable(ctx, dsn), "the check of a writable store, through the pooler")
}

// Behind PgBouncer in transaction mode, which lends a server session for
// one transaction at a time, the store's sessions would not be its own:
// Open and OpenReadOnly refuse it, saying so and what to do, before they
// set or create anything.
func TestPgBouncer_TransactionModeRefused(t *testing.T) {
	dsn := testdb.PgBouncer(t, testdb.EnvPgBouncerTransaction)
	ctx := context.Background()
	admin, schema := viaPooler(t, dsn)

	_, err := postgres.Open(ctx, dsn, postgres.Options{})
	require.ErrorIs(t, err, postgres.ErrTransactionPooling)
	assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
	assert.ErrorContains(t, err, "pool_mode=session")
	_, err = postgres.OpenReadOnly(ctx, dsn, postgres.Options{})
	require.ErrorIs(t, err, postgres.ErrTransactionPooling)
	require.ErrorIs(t, postgres.CheckWritable(ctx, dsn), postgres.ErrTransactionPooling)

	var n int
	require.NoError(t, admin.QueryRow(`SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = $1`, schema).Scan(&n))
	assert.Zero(t, n, "the refused Open created nothing in the schema")
	// Nothing the store sends by set_config stayed on a session of the
	// pool, for its other clients.
	for range 3 {
		var path, plan string
		require.NoError(t, admin.QueryRow("SELECT current_setting('search_path'), current_setting('plan_cache_mode')").Scan(&path, &plan))
		assert.NotContains(t, path, schema)
		assert.Equal(t, "auto", plan)
	}
}

// Behind PgBouncer in transaction mode with server_round_robin=1 and two
// server sessions in the pool, both warm, a client that reads its
// session's process id twice, around another client's transaction, gets
// the same session both times (the other is held by that transaction):
// a probe that trusts it takes the pool for session mode, and Open used
// to fail in the migrations with a bare 'prepared statement
// "stmtcache_..." does not exist' (or "already exists"). Open refuses it
// as the pooler it is, every time, and creates nothing.
func TestPgBouncer_RoundRobinTransactionModeRefused(t *testing.T) {
	dsn := testdb.PgBouncer(t, testdb.EnvPgBouncerRoundRobin)
	ctx := context.Background()
	admin, schema := viaPooler(t, dsn)
	// warm has both sessions of the pool made and idle: two transactions
	// at once.
	warm := func() {
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				_, err := admin.ExecContext(ctx, "SELECT pg_sleep(0.3)")
				assert.NoError(t, err)
			})
		}
		wg.Wait()
	}
	for round := range 4 {
		warm()
		_, err := postgres.Open(ctx, dsn, postgres.Options{})
		require.ErrorIs(t, err, postgres.ErrTransactionPooling, "round %d", round)
		assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
		assert.ErrorContains(t, err, "pool_mode=session")
		warm()
		_, err = postgres.OpenReadOnly(ctx, dsn, postgres.Options{})
		require.ErrorIs(t, err, postgres.ErrTransactionPooling, "round %d", round)
		warm()
		require.ErrorIs(t, postgres.CheckWritable(ctx, dsn), postgres.ErrTransactionPooling, "round %d", round)
	}
	var n int
	require.NoError(t, admin.QueryRow(`SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = $1`, schema).Scan(&n))
	assert.Zero(t, n, "the refused Open created nothing in the schema")
}

// A DSN with nothing to set after startup (no search_path) through
// PgBouncer: CheckWritable refuses one in transaction mode as Open does,
// rather than taking the pooler's answer for the server's, and passes one in
// session mode.
func TestPgBouncer_CheckWritableWithNothingToSet(t *testing.T) {
	ctx := context.Background()
	bare := func(env string) string {
		u, err := url.Parse(testdb.PgBouncer(t, env))
		require.NoError(t, err)
		u.RawQuery = "sslmode=disable"
		return u.String()
	}
	dsn := bare(testdb.EnvPgBouncerTransaction)
	_, openErr := postgres.Open(ctx, dsn, postgres.Options{})
	var opened *domain.StoreError
	require.ErrorAs(t, openErr, &opened)
	require.ErrorIs(t, openErr, postgres.ErrTransactionPooling)
	checkErr := postgres.CheckWritable(ctx, dsn)
	var checked *domain.StoreError
	require.ErrorAs(t, checkErr, &checked, "CheckWritable of %s", dsn)
	assert.Equal(t, opened.Kind, checked.Kind, "%v", checkErr)
	assert.Equal(t, opened.Err, checked.Err, "%v", checkErr)
	assert.Equal(t, opened.Advice, checked.Advice, "%v", checkErr)

	require.NoError(t, postgres.CheckWritable(ctx, bare(testdb.EnvPgBouncerSession)))
}

// When the query of its session's PID fails, CheckWritable closes the
// connection it made: a pg_backend_pid in the DSN's schema, searched before
// pg_catalog, fails that query; pg_stat_activity counts what is left.
func TestCheckWritable_PIDQueryFailsConnectionClosed(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t)
	schema := schemaOf(t, dsn)
	adminExec(t, dsn, "CREATE FUNCTION "+schema+".pg_backend_pid() RETURNS integer LANGUAGE plpgsql "+
		"AS $$BEGIN RAISE EXCEPTION 'no PID for the check'; END$$")
	app := schema + "_pid"
	dsn = withParam(t, withParam(t, dsn, "search_path", schema+",pg_catalog"), "application_name", app)

	require.ErrorContains(t, postgres.CheckWritable(ctx, dsn), "no PID for the check")
	admin, err := sql.Open("pgx", os.Getenv(testdb.EnvPostgres))
	require.NoError(t, err)
	defer admin.Close()
	var left int
	assert.Eventually(t, func() bool {
		require.NoError(t, admin.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&left))
		return left == 0
	}, 3*time.Second, 20*time.Millisecond, "the failed check's connection is closed")
}
