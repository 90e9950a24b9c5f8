package main

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/tests/testdb"
)

func TestSecrets_Postgres(t *testing.T) {
	for dsn, want := range map[string][]string{
		// as written, when net/url would escape it otherwise
		"postgres://u:p%2fss@h/db": {"p%2fss", "p/ss", "p%2Fss"},
		// libpq's multi-host form
		"postgres://u:pw1@h1:5432,h2:5433/db": {"pw1"},
		// a parameter, also when net/url cannot parse the URL
		"postgres://h/db?sslmode=disable&password=pw2":            {"pw2"},
		"postgres://h:bad port/db?sslmode=disable&password=pw%33": {"pw%33", "pw3"},
		// an unescaped '@' (refused by checkPostgresURL): the whole password
		"postgres://u:p@ss@h/db": {"p@ss"},
	} {
		got := secrets(dsn)
		for _, w := range want {
			assert.Contains(t, got, w, dsn)
		}
		for i := 1; i < len(got); i++ {
			assert.GreaterOrEqual(t, len(got[i-1]), len(got[i]), "longest first: %q", got)
		}
	}
	assert.Empty(t, secrets("postgres://u@h/db?sslmode=disable"))
}

func TestMain_PostgresURLWithAt(t *testing.T) {
	h := newHarness(t)
	h.env["AGENTS_DB"] = "postgres://app:se@cret@127.0.0.1:1/locks"
	for _, args := range [][]string{{"locks", "list"}, {"diagnostics"}} {
		r := h.run(args...)
		assert.Equal(t, exitUsage, r.code)
		assert.Contains(t, r.stderr, "write an '@' of the user name or password as %40")
		assert.NotContains(t, r.stderr, "cret")
	}
}

// schemaRows returns every row of the locks and version tables of dsn.
func schemaRows(t *testing.T, dsn string) []string {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	var out []string
	for _, table := range []string{"locks", "locks_schema_version"} {
		rows, err := db.Query("SELECT t::text FROM " + table + " t ORDER BY 1")
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

func TestMain_Postgres(t *testing.T) {
	t.Run("StaleLocksWarnAndCleanupReportsTheSameCount", func(t *testing.T) {
		h := newHarness(t)
		h.env["AGENTS_DB"] = testdb.Postgres(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "5s")
		h.mustRun("locks", "acquire", "plan", "p2", "--owner", "bob")
		h.clk.Add(10 * time.Second)
		before := schemaRows(t, h.env["AGENTS_DB"])

		var rep report
		h.mustRun("--json", "diagnostics").decode(t, &rep)
		assert.True(t, rep.OK)
		stale := checkNamed(t, rep, "stale_locks")
		assert.Equal(t, statusWarn, stale.Status)
		require.NotNil(t, stale.Count)
		assert.Equal(t, 1, *stale.Count)
		active := checkNamed(t, rep, "active_locks")
		require.NotNil(t, active.Oldest)
		assert.Equal(t, "bob", active.Oldest.OwnerID)
		assert.Contains(t, active.Detail, `"bob" since 2026-11-29 21:00:00 TST (10s ago)`)
		assert.Equal(t, before, schemaRows(t, h.env["AGENTS_DB"]), "diagnostics changed no row")

		var ls []listedLock
		h.mustRun("--json", "locks", "list", "--all").decode(t, &ls)
		require.Len(t, ls, 2)
		assert.True(t, ls[0].Expired)

		var n countDoc
		h.mustRun("--json", "locks", "cleanup").decode(t, &n)
		assert.Equal(t, *stale.Count, n.Count)
		h.mustRun("--json", "diagnostics").decode(t, &rep)
		assert.Equal(t, statusOK, checkNamed(t, rep, "stale_locks").Status)
	})
	t.Run("ExpiredLockIsTakenOver", func(t *testing.T) {
		h := newHarness(t)
		h.env["AGENTS_DB"] = testdb.Postgres(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "5s")
		r := h.run("locks", "acquire", "plan", "p1", "--owner", "bob")
		assert.Equal(t, exitConflict, r.code)
		assert.Contains(t, r.stderr, `held by another owner: "alice"`)
		r = h.run("locks", "renew", "plan", "p1", "--owner", "alice")
		assert.Equal(t, exitOK, r.code, r.stderr)
		h.clk.Add(6 * time.Minute)
		r = h.run("locks", "renew", "plan", "p1", "--owner", "alice")
		assert.Equal(t, exitExpired, r.code, r.stderr)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "bob")
	})
}
