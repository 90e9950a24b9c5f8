package cli

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/tests/testdb"
)

// The same commands against a PostgreSQL server: each test gets a scratch
// schema of the server that LOCKS_TEST_POSTGRES_DSN names (the DSN's
// search_path points at it), and skips without one.

// newPGAgents runs agents with --db set to a new, empty schema.
func newPGAgents(t *testing.T) *agents {
	t.Helper()
	a := newAgents(t)
	a.db = testdb.Postgres(t)
	return a
}

// pgState is what must not change in the schema of dsn: every relation in
// it (tables, indexes, sequences), and every row of its tables.
func pgState(t *testing.T, dsn string) []string {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	var tables, out []string
	rows, err := db.Query(`SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var name, kind string
		require.NoError(t, rows.Scan(&name, &kind))
		out = append(out, name+" "+kind)
		if kind == "r" {
			tables = append(tables, name)
		}
	}
	require.NoError(t, rows.Err())
	rows.Close()
	for _, table := range tables {
		rows, err := db.Query(fmt.Sprintf("SELECT t::text FROM %q t ORDER BY 1", table))
		require.NoError(t, err)
		for rows.Next() {
			var row string
			require.NoError(t, rows.Scan(&row))
			out = append(out, table+" "+row)
		}
		require.NoError(t, rows.Err())
		rows.Close()
	}
	return out
}

// assertNothingCreated checks that the test's directory, which holds the
// HOME and XDG_DATA_HOME of the runs, is still empty: no default database
// and no data directory were made for a PostgreSQL URL.
func assertNothingCreated(t *testing.T, a *agents) {
	t.Helper()
	entries, err := os.ReadDir(a.dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing is created on the file system for a PostgreSQL database")
}

// TestCLI_Postgres_Commands runs the lock commands, in order, on one
// schema; each step starts from the state the previous left.
func TestCLI_Postgres_Commands(t *testing.T) {
	t.Parallel()
	a := newPGAgents(t)

	var held lock
	r := a.mustRun("--json", "--owner", "A", "locks", "acquire", "plan", "p1")
	var obj map[string]any
	r.decode(t, &obj)
	assertKeys(t, obj, append(lockKeys, "reentered")...)
	r.decode(t, &held)
	assert.Equal(t, "A", held.OwnerID)

	r = a.run("--json", "--owner", "B", "locks", "acquire", "plan", "p1")
	require.Equal(t, 3, r.code, "stderr: %s", r.stderr)
	assertConflict(t, r, "A")
	r = a.run("--owner", "B", "locks", "acquire", "plan", "p1")
	assert.Equal(t, 3, r.code)
	assert.Contains(t, r.stderr, `plan/p1 is held by another owner: "A"`)

	var renewed lock
	a.mustRun("--json", "--owner", "A", "locks", "renew", "plan", "p1", "--ttl", "10m").decode(t, &renewed)
	assert.Equal(t, held.Token, renewed.Token)
	assert.True(t, renewed.ExpiresAt.After(held.ExpiresAt))
	assert.Equal(t, 3, a.run("--owner", "B", "locks", "renew", "plan", "p1").code)
	assert.Equal(t, 4, a.run("--owner", "A", "locks", "renew", "plan", "p9").code)

	a.mustRun("--owner", "B", "locks", "acquire", "project", "y")
	var ls []lock
	a.mustRun("--json", "locks", "list").decode(t, &ls)
	require.Len(t, ls, 2)
	assert.Equal(t, "p1", ls[0].ResourceID)
	assert.False(t, ls[0].Expired)
	a.mustRun("--json", "locks", "list", "--owner", "B").decode(t, &ls)
	require.Len(t, ls, 1)
	assert.Equal(t, "y", ls[0].ResourceID)
	assert.Regexp(t, `(?m)^plan +p1 +A +\d+ +.* +active$`, a.mustRun("locks", "list").stdout)

	r = a.mustRun("--json", "--owner", "B", "locks", "release", "plan", "p1")
	var refused map[string]any
	r.decode(t, &refused)
	assert.Equal(t, false, refused["released"])
	require.IsType(t, map[string]any{}, refused["holder"], "another owner's lock is named: %s", r.stdout)
	assert.Equal(t, "A", refused["holder"].(map[string]any)["owner_id"])
	r = a.mustRun("--json", "--owner", "A", "locks", "release", "plan", "p1")
	assert.JSONEq(t, `{"released": true, "owner_id": "A", "resource_type": "plan", "resource_id": "p1"}`, r.stdout)

	seedExpired(t, a.db, "old1", "old2")
	a.mustRun("--json", "locks", "list", "--all").decode(t, &ls)
	require.Len(t, ls, 3)
	assert.True(t, ls[0].Expired)
	var count struct{ Count int }
	a.mustRun("--json", "locks", "cleanup").decode(t, &count)
	assert.Equal(t, 2, count.Count, "cleanup purges the two expired locks")
	assert.Equal(t, "No expired locks to purge.\n", a.mustRun("locks", "cleanup").stdout)

	a.mustRun("--json", "--owner", "B", "locks", "release-all").decode(t, &count)
	assert.Equal(t, 1, count.Count)
	a.mustRun("--json", "locks", "list", "--all").decode(t, &ls)
	assert.Empty(t, ls)

	assertNothingCreated(t, a)
}

// TestCLI_Postgres_ConcurrentAcquireOneWinner starts several processes at
// once on a new schema: they race to migrate it (under goose's session
// lock), then for the lock, and exactly one may win.
func TestCLI_Postgres_ConcurrentAcquireOneWinner(t *testing.T) {
	t.Parallel()
	a := newPGAgents(t)
	const n = 4
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = a.run("--owner", fmt.Sprint("owner-", i), "locks", "acquire", "plan", "p1")
		})
	}
	wg.Wait()
	codes := map[int]int{}
	for _, r := range results {
		codes[r.code]++
	}
	assert.Equal(t, map[int]int{0: 1, 3: n - 1}, codes, "%+v", results)
}

func TestCLI_Postgres_Diagnostics(t *testing.T) {
	t.Parallel()

	t.Run("StaleLocksWarnAndRowsUnchanged", func(t *testing.T) {
		a := newPGAgents(t)
		a.mustRun("--owner", "A", "locks", "acquire", "plan", "live")
		seedExpired(t, a.db, "s1", "s2", "s3")
		before := pgState(t, a.db)
		require.Contains(t, before, "locks_schema_version r")

		r := a.mustRun("--json", "diagnostics")
		var rep report
		r.decode(t, &rep)
		assert.True(t, rep.OK, "a warning alone exits 0")
		assert.Equal(t, []string{"database", "schema", "stale_locks", "active_locks", "orphaned_locks", "clock"}, rep.names())
		assert.Equal(t, "ok", rep.check("clock").Status, rep.check("clock").Detail)
		assert.Equal(t, "ok", rep.check("database").Status, rep.check("database").Detail)
		assert.Contains(t, rep.check("database").Detail, "accepts connections, and this user can write there")
		assert.Equal(t, "ok", rep.check("schema").Status, rep.check("schema").Detail)
		assert.Contains(t, rep.check("schema").Detail, "migration m4_001_concurrency_locks is applied in schema")
		stale := rep.check("stale_locks")
		assert.Equal(t, "warn", stale.Status)
		require.NotNil(t, stale.Count)
		assert.Equal(t, 3, *stale.Count)
		assert.Contains(t, stale.Detail, "agents locks cleanup --db '"+a.db+"'")
		require.NotNil(t, rep.check("active_locks").Count)
		assert.Equal(t, 1, *rep.check("active_locks").Count)

		r = a.mustRun("diagnostics")
		assert.Contains(t, r.stdout, "Diagnostics of "+a.db+"\n")
		assert.Regexp(t, `(?m)^  warn +stale_locks +3 locks have expired but are still stored`, r.stdout)
		assert.Contains(t, r.stdout, "No check failed; 1 warning.")

		assert.Equal(t, before, pgState(t, a.db), "diagnostics changed the schema or its rows")

		var purged struct{ Count int }
		a.mustRun("--json", "locks", "cleanup").decode(t, &purged)
		assert.Equal(t, *stale.Count, purged.Count, "cleanup reports what diagnostics counted")
		assertNothingCreated(t, a)
	})

	t.Run("EmptySchemaFailsAndStaysEmpty", func(t *testing.T) {
		a := newPGAgents(t)
		require.Empty(t, pgState(t, a.db))

		r := a.run("--json", "diagnostics")
		assert.Equal(t, 1, r.code)
		var rep report
		r.decode(t, &rep)
		assert.False(t, rep.OK)
		assert.Equal(t, "ok", rep.check("database").Status, "this user could create the table: %s", rep.check("database").Detail)
		schema := rep.check("schema")
		assert.Equal(t, "fail", schema.Status)
		assert.Contains(t, schema.Detail, "m4_001_concurrency_locks is not applied in schema")
		assert.Contains(t, schema.Detail, "there is no locks table there")
		assert.Contains(t, schema.Detail, "run 'agents --db ")
		for _, name := range []string{"stale_locks", "active_locks"} {
			assert.Equal(t, "not checked: no locks table to read (see the schema check)", rep.check(name).Detail)
		}
		r = a.run("diagnostics")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, r.stdout, "4 checks failed.")

		assert.Empty(t, pgState(t, a.db), "diagnostics created nothing: no version table, no locks table")
		assertNothingCreated(t, a)

		r = a.runAdvice(schema.Detail)
		require.Equal(t, 0, r.code, "the advised command fails: %s", r.stderr)
		a.mustRun("diagnostics")
	})

	t.Run("HandMadeTableFailsSchema", func(t *testing.T) {
		a := newPGAgents(t)
		db, err := sql.Open("pgx", a.db)
		require.NoError(t, err)
		_, err = db.Exec("CREATE TABLE locks (id bigint PRIMARY KEY, owner_id text, resource_type text, resource_id text, acquired_at text, expires_at text)")
		require.NoError(t, err)
		require.NoError(t, db.Close())
		before := pgState(t, a.db)

		r := a.run("--json", "diagnostics")
		assert.Equal(t, 1, r.code)
		var rep report
		r.decode(t, &rep)
		schema := rep.check("schema")
		assert.Equal(t, "fail", schema.Status)
		assert.Contains(t, schema.Detail, "yet a locks table exists there: it was made by hand")
		assert.Equal(t, before, pgState(t, a.db))
	})

	t.Run("UnknownDatabaseFails", func(t *testing.T) {
		a := newPGAgents(t)
		u, err := url.Parse(a.db)
		require.NoError(t, err)
		u.Path = "/locks_no_such_database"
		a.db = u.String()

		r := a.run("--json", "diagnostics")
		assert.Equal(t, 1, r.code)
		var rep report
		r.decode(t, &rep)
		database := rep.check("database")
		assert.Equal(t, "fail", database.Status)
		assert.Contains(t, database.Detail, `database "locks_no_such_database" does not exist`)
		assert.Contains(t, database.Detail, "check the host, port, database name, user and password of the URL")
		assert.Equal(t, "not checked: the database could not be opened", rep.check("schema").Detail)
	})

	t.Run("ReadOnlyTransactionsFailDatabase", func(t *testing.T) {
		a := newPGAgents(t)
		a.mustRun("--owner", "A", "locks", "acquire", "plan", "live")
		a.db += "&default_transaction_read_only=on"

		r := a.run("--json", "diagnostics")
		assert.Equal(t, 1, r.code)
		var rep report
		r.decode(t, &rep)
		database := rep.check("database")
		assert.Equal(t, "fail", database.Status)
		assert.Contains(t, database.Detail, "accepts connections, but the service could not write there: transactions are read-only by default")
		assert.Equal(t, "ok", rep.check("schema").Status, "a read-only server can still be inspected")
		assert.Equal(t, 1, *rep.check("active_locks").Count)

		r = a.run("--owner", "A", "locks", "release", "plan", "live")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, r.stderr, "lock store is read-only; connect to the primary server")
		assert.NotContains(t, r.stderr, "directory", "the advice is about a server, not a file")
	})
}

// TestCLI_Postgres_PasswordNeverShown points every command at a port where
// nothing listens, with a password in the URL in each way it can be
// written: the commands fail, saying which server, and the password never
// appears. It needs no server, so it runs everywhere.
func TestCLI_Postgres_PasswordNeverShown(t *testing.T) {
	t.Parallel()
	const secret = "S3cr3t"
	for _, dsn := range []string{
		"postgres://app:" + secret + "-pw@127.0.0.1:1/locks?sslmode=disable&connect_timeout=5",
		"postgresql://app:" + secret + "%2fpw@127.0.0.1:1/locks?sslmode=disable", // escaped otherwise than net/url would
		"postgres://app:" + secret + "%40pw@127.0.0.1:1/locks?sslmode=disable",
		"postgres://app@127.0.0.1:1/locks?sslmode=disable&password=" + secret + "-pw",
		"postgres://app:" + secret + "-pw@127.0.0.1:1,127.0.0.1:2/locks?sslmode=disable",
	} {
		a := newAgents(t)
		for _, args := range [][]string{
			{"--owner", "A", "locks", "acquire", "plan", "p1"},
			{"--owner", "A", "locks", "renew", "plan", "p1"},
			{"--owner", "A", "locks", "release", "plan", "p1"},
			{"--owner", "A", "locks", "release-all"},
			{"locks", "list", "--all"},
			{"locks", "cleanup"},
			{"diagnostics"},
		} {
			for _, args := range [][]string{args, append([]string{"--json"}, args...)} {
				for _, viaEnv := range []bool{false, true} {
					var r result
					if viaEnv {
						r = a.runEnv([]string{"AGENTS_DB=" + dsn}, args...)
					} else {
						r = a.runEnv(nil, append([]string{"--db", dsn}, args...)...)
					}
					out := r.stdout + r.stderr
					assert.Equal(t, 1, r.code, "%s %v: %s", dsn, args, out)
					assert.NotContains(t, out, secret, "%s %v", dsn, args)
					assert.Contains(t, out, "127.0.0.1:1", "the message says which server")
					assert.Contains(t, out, "that the server is running", "%s %v", dsn, args)
					assert.NotContains(t, out, "directory", "%s %v", dsn, args)
					if args[len(args)-1] != "diagnostics" {
						assert.Equal(t, 1, strings.Count(r.stderr, "/locks?"), "the URL is quoted once: %s", r.stderr)
						assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "a failure is one line: %s", r.stderr)
					} else if !strings.HasPrefix(args[0], "--json") {
						assert.Regexp(t, `(?m)^  fail +database +cannot connect to postgres.*\(diagnostics never creates a database or a schema\)$`, r.stdout)
					}
				}
			}
		}
		assertNothingCreated(t, a)
	}

	t.Run("UnescapedAtIsRefused", func(t *testing.T) {
		// libpq and pgx would end the user info at the first '@' and quote
		// the rest of the password as the host name.
		a := newAgents(t)
		dsn := "postgres://app:" + secret + "@pw@127.0.0.1:1/locks?sslmode=disable"
		for _, args := range [][]string{{"locks", "list"}, {"--json", "diagnostics"}} {
			r := a.runEnv(nil, append([]string{"--db", dsn}, args...)...)
			assert.Equal(t, 2, r.code, "%v", args)
			assert.NotContains(t, r.stdout+r.stderr, secret)
			assert.NotContains(t, r.stdout+r.stderr, "pw@")
			assert.Contains(t, r.stderr, "write an '@' of the user name or password as %40")
		}
	})
}

// TestCLI_Postgres_EmptySchemaRefused: in a schema that the migrations
// have not set up, only the commands that take a lock create the locks
// table; every other command refuses and creates nothing, not even
// goose's version table.
func TestCLI_Postgres_EmptySchemaRefused(t *testing.T) {
	t.Parallel()
	a := newPGAgents(t)
	before := pgState(t, a.db)
	for _, args := range [][]string{
		{"locks", "list"},
		{"locks", "list", "--all"},
		{"locks", "cleanup"},
		{"--owner", "A", "locks", "renew", "plan", "p1"},
		{"--owner", "A", "locks", "release", "plan", "p1"},
		{"--owner", "A", "locks", "release-all"},
	} {
		r := a.run(args...)
		assert.Equal(t, 1, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "is not a lock database: it has no locks table", "%v", args)
		r = a.run(append([]string{"--json"}, args...)...)
		assertError(t, r, "no_database")
	}
	assert.Equal(t, before, pgState(t, a.db))
	assertNothingCreated(t, a)

	a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1")
	assert.Contains(t, a.mustRun("locks", "list").stdout, "p1")
}

// TestCLI_Postgres_SearchPathNamesNoSchema: a URL whose search_path names
// no schema that exists is refused with what is wrong (the search_path)
// and what to do (create the schema or fix the search_path), not as a
// schema named "", and without advising --create, which PostgreSQL does
// not need: it creates no schema anyway.
func TestCLI_Postgres_SearchPathNamesNoSchema(t *testing.T) {
	t.Parallel()
	a := newPGAgents(t)
	u, err := url.Parse(a.db)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", "locks_no_such_schema")
	u.RawQuery = q.Encode()
	a.db = u.String()
	for _, args := range [][]string{
		{"locks", "list"},
		{"locks", "cleanup"},
		{"--owner", "A", "locks", "release-all"},
	} {
		r := a.run(args...)
		assert.Equal(t, 1, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "the search_path (locks_no_such_schema) names no schema that exists", "%v", args)
		assert.Contains(t, r.stderr, "create the schema", "%v", args)
		assert.NotContains(t, r.stderr, `(schema "")`, "%v", args)
		assert.NotContains(t, r.stderr, "--create", "%v", args)
		r = a.run(append([]string{"--json"}, args...)...)
		assertError(t, r, "no_database")
	}
	assertNothingCreated(t, a)
}

// TestCLI_PgBouncer: through PgBouncer in session mode the commands work
// as on the server, diagnostics included; in transaction mode every
// command refuses the URL, saying why and what to do.
func TestCLI_PgBouncer(t *testing.T) {
	t.Run("SessionMode", func(t *testing.T) {
		a := newAgents(t)
		a.db = testdb.PgBouncer(t, testdb.EnvPgBouncerSession)
		a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1")
		assert.Contains(t, a.mustRun("locks", "list").stdout, "p1")
		a.mustRun("diagnostics")
		a.mustRun("--owner", "A", "locks", "release", "plan", "p1")
	})
	t.Run("TransactionModeRefused", func(t *testing.T) {
		a := newAgents(t)
		a.db = testdb.PgBouncer(t, testdb.EnvPgBouncerTransaction)
		for _, args := range [][]string{
			{"--owner", "A", "locks", "acquire", "plan", "p1"},
			{"locks", "list"},
			{"diagnostics"},
		} {
			r := a.run(args...)
			assert.Equal(t, 1, r.code, "%v: %s", args, r.stderr)
			assert.Contains(t, r.stdout+r.stderr, "pooler in transaction or statement mode", "%v", args)
			assert.Contains(t, r.stdout+r.stderr, "pool_mode=session", "%v", args)
		}
	})
}
