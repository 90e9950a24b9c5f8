package cli

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
)

// everyCommand is one command line of each agents command that opens the
// database, with its owner; "locks run" runs true.
var everyCommand = map[string][]string{
	"list":        {"locks", "list"},
	"list-all":    {"locks", "list", "--all"},
	"diagnostics": {"diagnostics"},
	"cleanup":     {"locks", "cleanup"},
	"renew":       {"--owner", "op", "locks", "renew", "plan", "p1"},
	"release":     {"--owner", "op", "locks", "release", "plan", "p1"},
	"release-all": {"--owner", "op", "locks", "release-all"},
	"acquire":     {"--owner", "op", "locks", "acquire", "plan", "p1"},
	"run":         {"--owner", "op", "locks", "run", "plan", "p1", "--", "true"},
}

// TestCLI_DBNamesNoDatabaseFile: a --db that names a directory is reported
// as one (exit 1, no_database), and a URL of a scheme other than postgres,
// postgresql and file is a usage error (exit 2) that lists what --db
// takes; neither is taken for a file path, and nothing is created.
func TestCLI_DBNamesNoDatabaseFile(t *testing.T) {
	t.Parallel()
	for name, args := range everyCommand {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			before := snapshot(t, a.dir)
			r := a.runEnv(nil, append([]string{"--json", "--db", a.dir}, args...)...)
			assert.Equal(t, 1, r.code, r.stderr)
			assert.Contains(t, r.stderr, a.dir+" is a directory, not a lock database")
			assert.NotContains(t, r.stderr, "read-only")
			var doc map[string]map[string]any
			r.decode(t, &doc)
			assert.Equal(t, "no_database", doc["error"]["code"])
			assert.Equal(t, before, snapshot(t, a.dir))

			for _, url := range []string{"mysql://app:secret@db.example/locks", "http://example.com/agents.db", "HTTPS://example.com/x"} {
				r := a.runEnv(nil, append([]string{"--db", url}, args...)...)
				assert.Equal(t, 2, r.code, r.stderr)
				assert.Contains(t, r.stderr, "pass a SQLite file path, a file: URI")
				assert.Contains(t, r.stderr, "postgres://")
				assert.NotContains(t, r.stderr, "secret")
			}
			entries, err := os.ReadDir(".")
			assert.NoError(t, err)
			for _, e := range entries {
				assert.NotContains(t, []string{"mysql:", "http:", "HTTPS:"}, e.Name(), "a URL taken for a path")
			}
		})
	}
}
