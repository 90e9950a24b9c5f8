package cli

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unasked drops the AGENTS_CREATE=1 that newAgents sets, for a test of
// what acquire and run create when nobody asks them to.
func (a *agents) unasked() *agents {
	a.env = slices.DeleteFunc(a.env, func(kv string) bool { return kv == "AGENTS_CREATE=1" })
	return a
}

// TestCLI_CreateOnlyWhenAsked: a mistyped --db on acquire or run creates
// nothing beside the real database and says how to create one; --create
// or AGENTS_CREATE=1 creates it; the default database needs neither.
func TestCLI_CreateOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	commands := map[string][]string{
		"acquire": {"--owner", "op", "locks", "acquire", "plan", "p1"},
		"run":     {"--owner", "op", "locks", "run", "plan", "p1", "--", "true"},
	}
	for name, args := range commands {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			a.mustRun("--owner", "ghost", "locks", "acquire", "plan", "held")
			a.unasked()
			before := snapshot(t, a.dir)
			typo := filepath.Join(a.dir, "agnets.db")

			r := a.runEnv(nil, append([]string{"--db", typo, "--json"}, args...)...)
			assert.Equal(t, 1, r.code, r.stderr)
			assert.Equal(t, before, snapshot(t, a.dir), "a mistyped --db creates nothing")
			assert.Contains(t, r.stderr, "there is no lock database at "+typo)
			assert.Contains(t, r.stderr, "pass --create (or set AGENTS_CREATE=1)")
			var doc map[string]map[string]any
			r.decode(t, &doc)
			assert.Equal(t, "no_database", doc["error"]["code"])

			r = a.runEnv([]string{"AGENTS_DB=" + typo}, args...)
			assert.Equal(t, 1, r.code, r.stderr)
			assert.Equal(t, before, snapshot(t, a.dir), "a mistyped AGENTS_DB creates nothing")

			noDir := filepath.Join(a.dir, "nodir", "agents.db")
			r = a.runEnv(nil, append([]string{"--db", noDir}, args...)...)
			assert.Equal(t, 1, r.code, r.stderr)
			assert.Contains(t, r.stderr, "create the directory, then pass --create")
			assert.NoDirExists(t, filepath.Dir(noDir))

			// --create comes after the command's name: it is acquire's and run's own.
			r = a.runEnv(nil, append([]string{"--db", typo}, slices.Insert(slices.Clone(args), 4, "--create")...)...)
			require.Equal(t, 0, r.code, r.stderr)
			assert.FileExists(t, typo)

			other := filepath.Join(a.dir, "other.db")
			r = a.runEnv([]string{"AGENTS_CREATE=1"}, append([]string{"--db", other}, args...)...)
			require.Equal(t, 0, r.code, r.stderr)
			assert.FileExists(t, other)

			r = a.runEnv([]string{"AGENTS_CREATE=maybe"}, append([]string{"--db", filepath.Join(a.dir, "x.db")}, args...)...)
			assert.Equal(t, 2, r.code, r.stderr)
			assert.Contains(t, r.stderr, "AGENTS_CREATE")

			r = a.runEnv(nil, args...)
			require.Equal(t, 0, r.code, "the default database is created unasked: %s", r.stderr)
			assert.FileExists(t, filepath.Join(a.dir, "data", "cleveragents", "agents.db"))
		})
	}
}
