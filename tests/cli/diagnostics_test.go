package cli

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"
)

func TestCLI_Diagnostics(t *testing.T) {
	t.Parallel()

	t.Run("StaleLocksWarnAndFileUnchanged", func(t *testing.T) {
		a := newAgents(t)
		a.mustRun("--owner", "A", "locks", "acquire", "plan", "live")
		seedExpired(t, a.db, "s1", "s2", "s3")
		before := snapshot(t, a.dir)

		r := a.mustRun("--json", "diagnostics")
		var rep report
		r.decode(t, &rep)
		assert.True(t, rep.OK, "a warning alone exits 0")
		stale := rep.check("stale_locks")
		assert.Equal(t, "warn", stale.Status)
		require.NotNil(t, stale.Count)
		assert.Equal(t, 3, *stale.Count)
		assert.Contains(t, stale.Detail, "cleanup has not run")
		assert.Contains(t, stale.Detail, "agents locks cleanup --db "+a.db)
		assert.Equal(t, 1, *rep.check("active_locks").Count)

		r = a.mustRun("diagnostics")
		assert.Regexp(t, `(?m)^  warn +stale_locks +3 locks have expired but are still stored`, r.stdout)
		assert.Contains(t, r.stdout, "No check failed; 1 warning.")

		assert.Equal(t, before, snapshot(t, a.dir), "diagnostics changed the database or created a file beside it")

		var purged struct{ Count int }
		a.mustRun("--json", "locks", "cleanup").decode(t, &purged)
		assert.Equal(t, *stale.Count, purged.Count, "cleanup reports what diagnostics counted")
	})

	t.Run("ReadsLocksStillInTheWAL", func(t *testing.T) {
		a := newAgents(t)
		// An open store keeps its -wal file, whose commits are not in the
		// database file yet: diagnostics must read through it.
		c := openPast(t, a.db, "s1", "s2")
		defer c.Close()
		require.FileExists(t, a.db+"-wal")
		before := snapshot(t, a.dir)

		var rep report
		a.mustRun("--json", "diagnostics").decode(t, &rep)
		require.NotNil(t, rep.check("stale_locks").Count)
		assert.Equal(t, 2, *rep.check("stale_locks").Count)
		assert.Equal(t, before[filepath.Base(a.db)], snapshot(t, a.dir)[filepath.Base(a.db)])
	})

	t.Run("HandMadeDatabaseFailsSchema", func(t *testing.T) {
		a := newAgents(t)
		db, err := sql.Open("sqlite", a.db)
		require.NoError(t, err)
		_, err = db.Exec("CREATE TABLE locks (id INTEGER PRIMARY KEY, owner_id TEXT, resource_type TEXT, resource_id TEXT, acquired_at TEXT, expires_at TEXT)")
		require.NoError(t, err)
		require.NoError(t, db.Close())
		before := snapshot(t, a.dir)

		r := a.run("--json", "diagnostics")
		assert.Equal(t, 1, r.code)
		var rep report
		r.decode(t, &rep)
		assert.False(t, rep.OK)
		assert.Equal(t, "ok", rep.check("database").Status)
		schema := rep.check("schema")
		assert.Equal(t, "fail", schema.Status)
		assert.Contains(t, schema.Detail, "m4_001_concurrency_locks is not applied")
		assert.Contains(t, schema.Detail, "let the service create a new database")
		assert.Equal(t, before, snapshot(t, a.dir))
	})

	t.Run("EmptyFileFailsSchemaWithAdvice", func(t *testing.T) {
		a := newAgents(t)
		writeFile(t, a.db, "")
		r := a.run("diagnostics")
		assert.Equal(t, 1, r.code)
		assert.Regexp(t, `(?m)^  fail +schema +migration m4_001_concurrency_locks is not applied and there is no locks table: .*run 'agents --db \S+ locks run plan setup -- true'`, r.stdout)
		assert.Regexp(t, `(?m)^  fail +stale_locks +not checked: no locks table to read \(see the schema check\)$`, r.stdout)
		assert.Contains(t, r.stdout, "4 checks failed.")
		assert.Contains(t, r.stderr, "a check failed")
	})
}
