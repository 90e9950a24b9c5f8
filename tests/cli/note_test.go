package cli

import (
	"strings"
	"testing"

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
