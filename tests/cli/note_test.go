package cli

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

func TestCLI_Note(t *testing.T) {
	t.Parallel()
	testNote(t, newAgents(t))
}

func TestCLI_Postgres_Note(t *testing.T) {
	t.Parallel()
	testNote(t, newPGAgents(t))
}

// testNote runs the commands that take or show a note on a's database.
func testNote(t *testing.T, a *agents) {
	const note = "deploying v2 — ticket OPS-7"
	r := a.mustRun("--json", "--owner", "A", "locks", "acquire", "plan", "p1", "--note", note)
	var obj map[string]any
	r.decode(t, &obj)
	assertKeys(t, obj, append(lockKeys, "reentered", "note")...)
	assert.Equal(t, note, obj["note"])
	assert.Contains(t, a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1").stdout, "note      "+note,
		"a re-entry shows the note it keeps")

	var ls []map[string]any
	a.mustRun("--json", "locks", "list").decode(t, &ls)
	require.Len(t, ls, 1)
	assertKeys(t, ls[0], append(lockKeys, "expired", "note")...)
	assert.Equal(t, note, ls[0]["note"])
	assert.Regexp(t, `(?m)^plan +p1 +A +\d+ +.* +active +`+note+`$`, a.mustRun("locks", "list").stdout)
	r = a.run("diagnostics")
	assert.Contains(t, r.stdout, `held by "A" (note "`+note+`") since`, "the oldest lock's note: %s", r.stderr)
	r = a.run("--json", "diagnostics")
	assert.Contains(t, r.stdout, `"note": "`+note+`"`)

	r = a.run("--json", "--owner", "B", "locks", "acquire", "plan", "p1", "--note", "mine")
	require.Equal(t, 3, r.code, "stderr: %s", r.stderr)
	var doc struct {
		Error struct {
			Message string         `json:"message"`
			Holder  map[string]any `json:"holder"`
		} `json:"error"`
	}
	r.decode(t, &doc)
	assert.Equal(t, note, doc.Error.Holder["note"], "the holder's note, for the owner refused")
	assert.Contains(t, doc.Error.Message, `note "`+note+`"`)
	assert.Contains(t, r.stderr, "note      "+note)

	// A handle of locks run carries its note too, seen from inside CMD.
	r = a.mustRun("--owner", "C", "locks", "run", "plan", "p2", "--note", "run note", "--",
		agentsBin, "--db", a.db, "--json", "locks", "list", "--owner", "C")
	assert.Contains(t, r.stdout, `"note": "run note"`)

	// Without a note, the key is absent: scripts see the keys of before.
	var plain map[string]any
	a.mustRun("--json", "--owner", "D", "locks", "acquire", "plan", "p3").decode(t, &plain)
	assertKeys(t, plain, append(lockKeys, "reentered")...)

	for _, bad := range []string{strings.Repeat("x", domain.MaxNoteBytes+1), "two\nlines"} {
		for _, cmd := range [][]string{{"locks", "acquire", "plan", "p4"}, {"locks", "run", "plan", "p4", "--note", bad, "--", "true"}} {
			args := append([]string{"--json", "--owner", "E"}, cmd...)
			if cmd[1] == "acquire" {
				args = append(args, "--note", bad)
			}
			r := a.run(args...)
			assert.Equal(t, 2, r.code, "a bad note is a validation error: %s", r.stderr)
			assertError(t, r, "validation")
			assert.Contains(t, r.stderr, "note")
		}
	}
	a.mustRun("--json", "locks", "list", "--owner", "E").decode(t, &ls)
	assert.Empty(t, ls, "a bad note writes nothing")
}

// A database at the migration before the note, which a process of an
// earlier release still serves, is read by list and diagnostics, which
// migrate nothing: its locks have no note.
func TestCLI_ListBeforeTheNoteMigration(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	raw, err := sql.Open("sqlite", a.db)
	require.NoError(t, err)
	defer raw.Close()
	firstMigrationOnly(t, raw, goose.DialectSQLite3, "../../adapters/sqlite/migrations")
	testListBeforeNote(t, a, raw, "?")
}

func TestCLI_Postgres_ListBeforeTheNoteMigration(t *testing.T) {
	t.Parallel()
	a := newPGAgents(t)
	raw, err := sql.Open("pgx", a.db)
	require.NoError(t, err)
	defer raw.Close()
	firstMigrationOnly(t, raw, goose.DialectPostgres, "../../adapters/postgres/migrations")
	testListBeforeNote(t, a, raw, "$")
}

func firstMigrationOnly(t *testing.T, db *sql.DB, dialect goose.Dialect, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_m4_001_concurrency_locks.sql"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	data, err := os.ReadFile(files[0])
	require.NoError(t, err)
	p, err := goose.NewProvider(dialect, db, fstest.MapFS{filepath.Base(files[0]): {Data: data}},
		goose.WithTableName("locks_schema_version"))
	require.NoError(t, err)
	_, err = p.Up(context.Background())
	require.NoError(t, err)
}

func testListBeforeNote(t *testing.T, a *agents, raw *sql.DB, param string) {
	ph := func(i int) string {
		if param == "?" {
			return "?"
		}
		return fmt.Sprintf("$%d", i)
	}
	_, err := raw.Exec(fmt.Sprintf("INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at) VALUES (%s, %s, %s, %s, %s)",
		ph(1), ph(2), ph(3), ph(4), ph(5)), "old", "plan", "p1", "2026-01-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z")
	require.NoError(t, err)

	var ls []map[string]any
	a.mustRun("--json", "locks", "list").decode(t, &ls)
	require.Len(t, ls, 1)
	assertKeys(t, ls[0], append(lockKeys, "expired")...)
	assert.Equal(t, "old", ls[0]["owner_id"])
	assert.Regexp(t, `(?m)^plan +p1 +old +\d+ +.* +active$`, a.mustRun("locks", "list").stdout)
	r := a.run("--json", "diagnostics")
	assert.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, `"owner_id": "old"`)
}
