package cli

import (
	"database/sql"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// advised is the command quoted in the first "run '...'" of out: words,
// each quoted for the shell or free of quotes and spaces.
var advised = regexp.MustCompile(`run '(agents(?: (?:'[^']*'|[^' ]+))*)'`)

// runAdvice runs, with sh, the command that out advises, as a user who
// pastes it would: "agents" is the binary under test on PATH.
func (a *agents) runAdvice(out string, env ...string) result {
	a.t.Helper()
	m := advised.FindStringSubmatch(out)
	require.NotNil(a.t, m, "no command advised in: %s", out)
	bin := filepath.Join(a.dir, "bin")
	require.NoError(a.t, os.MkdirAll(bin, 0o755))
	if _, err := os.Lstat(filepath.Join(bin, "agents")); err != nil {
		require.NoError(a.t, os.Symlink(agentsBin, filepath.Join(bin, "agents")))
	}
	env = append(env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "AGENTS_OWNER=advised")
	return a.runProgram(env, "sh", "-c", m[1])
}

// TestCLI_AdviceWorks runs every command that diagnostics (and a refusal
// of list) advises, in the situation that it advises it in, and checks
// that it succeeds and leads where it says.
func TestCLI_AdviceWorks(t *testing.T) {
	t.Parallel()
	// Each case makes a situation and returns the --db of it.
	cases := map[string]struct {
		make func(t *testing.T, a *agents) string
		// prepare does what the advice says in words before its command.
		prepare func(t *testing.T, db string)
		// readOnly: the --db reads only, so diagnostics's database check
		// keeps failing (as it says) after the advice.
		readOnly bool
	}{
		"MissingFile": {make: func(_ *testing.T, a *agents) string { return filepath.Join(a.dir, "new.db") }},
		"MissingDirectory": {
			make:    func(_ *testing.T, a *agents) string { return filepath.Join(a.dir, "sub", "new.db") },
			prepare: func(t *testing.T, db string) { require.NoError(t, os.MkdirAll(filepath.Dir(db), 0o700)) },
		},
		"EmptySQLiteFile": {make: func(t *testing.T, a *agents) string {
			db := filepath.Join(a.dir, "empty.db")
			makeSQLite(t, db, "CREATE TABLE t (x); DROP TABLE t")
			return db
		}},
		"NotSQLite": {
			make: func(t *testing.T, a *agents) string {
				db := filepath.Join(a.dir, "junk.db")
				writeFile(t, db, "not a database")
				return db
			},
			prepare: func(t *testing.T, db string) { require.NoError(t, os.Rename(db, db+".moved")) },
		},
		"StaleLocks": {make: func(t *testing.T, a *agents) string {
			seedExpired(t, a.db, "old")
			return a.db
		}},
		// diagnostics reads through a read-only URI; the cleanup it
		// advises writes, so it names the file without mode=ro.
		"StaleLocksReadOnlyURI": {readOnly: true, make: func(t *testing.T, a *agents) string {
			seedExpired(t, a.db, "old")
			return "file:" + a.db + "?mode=ro"
		}},
		"DefaultDatabase": {make: func(*testing.T, *agents) string { return "" }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAgents(t).unasked()
			db := tc.make(t, a)
			var env []string
			if db != "" {
				env = []string{"AGENTS_DB=" + db}
			}
			r := a.runEnv(env, "diagnostics")
			if tc.prepare != nil {
				tc.prepare(t, db)
			}
			r = a.runAdvice(r.stdout)
			require.Equal(t, 0, r.code, "the advised command fails: %s", r.stderr)
			r = a.runEnv(env, "diagnostics")
			if !tc.readOnly {
				assert.Equal(t, 0, r.code, "diagnostics still fails after the advice: %s", r.stdout)
			}
			assert.Contains(t, r.stdout, "no expired locks wait for cleanup")
		})
	}

	// No command is advised where none would succeed: acquire and run
	// refuse another application's file.
	t.Run("ForeignFile", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t).unasked()
		db := filepath.Join(a.dir, "notes.sqlite")
		makeSQLite(t, db, "CREATE TABLE notes (body TEXT)")

		r := a.runEnv(nil, "--db", db, "diagnostics")
		assert.Equal(t, 1, r.code)
		assert.Regexp(t, `(?m)^  fail +schema +.*another application's tables \(notes\); point --db`, r.stdout)
		assert.NotRegexp(t, advised, r.stdout, "no command to run: none would succeed")
		r = a.runEnv(nil, "--db", db, "--owner", "op", "locks", "run", "--create", "plan", "setup", "--", "true")
		assert.Equal(t, 1, r.code, "acquire and run refuse the file, as the advice says")

		// list's refusal advises diagnostics, which reports what the file holds.
		r = a.runEnv(nil, "--db", db, "locks", "list")
		require.Equal(t, 1, r.code)
		r = a.runAdvice(r.stderr, "AGENTS_DB="+db)
		assert.Equal(t, 1, r.code, "diagnostics fails a check on a file that is not a lock database")
		assert.Contains(t, r.stdout, "another application's tables (notes)")
	})

	// A file of another application with a locks table of its own: acquire
	// and run add nothing to it (they used to add the migration's tables,
	// then fail), and diagnostics does not advise moving it away.
	t.Run("ForeignFileWithItsOwnLocksTable", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t)
		db := filepath.Join(a.dir, "app.sqlite")
		makeSQLite(t, db, "CREATE TABLE users (name TEXT); CREATE TABLE locks (name TEXT, holder TEXT)")
		before := sqliteTables(t, db)

		for _, args := range [][]string{
			{"locks", "acquire", "plan", "p1"},
			{"locks", "run", "plan", "p1", "--", "true"},
		} {
			r := a.runEnv(nil, append([]string{"--db", db, "--owner", "op", "--json"}, args...)...)
			assert.Equal(t, 1, r.code, "%v: %s", args, r.stderr)
			var doc map[string]map[string]any
			r.decode(t, &doc)
			assert.Equal(t, "no_database", doc["error"]["code"], "%v", args)
			assert.Contains(t, r.stderr, "another application (tables users, and a locks table")
			assert.Equal(t, before, sqliteTables(t, db), "%v added tables", args)
		}
		r := a.runEnv(nil, "--db", db, "diagnostics")
		assert.Equal(t, 1, r.code)
		assert.Regexp(t, `(?m)^  fail +schema +.*another application's tables \(users\) and a locks table`, r.stdout)
		assert.NotContains(t, r.stdout, "move the file away")
		assert.NotRegexp(t, advised, r.stdout, "no command to run: none would succeed")
	})
}

// sqliteTables lists the tables of the SQLite file at path.
func sqliteTables(t *testing.T, path string) []string {
	t.Helper()
	sdb, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer sdb.Close()
	rows, err := sdb.Query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		out = append(out, name)
	}
	require.NoError(t, rows.Err())
	return out
}

// makeSQLite makes a SQLite file at path with what the statements leave.
func makeSQLite(t *testing.T, path, statements string) {
	t.Helper()
	sdb, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	_, err = sdb.Exec(statements)
	require.NoError(t, err)
	require.NoError(t, sdb.Close())
}
