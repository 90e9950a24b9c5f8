package cli

import (
	"os"
	"strings"
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

// TestCLI_MalformedDSNIsNoFile: a --db that reads as a PostgreSQL
// keyword/value DSN but is malformed (a keyword without its value, a stray
// word, an unterminated quote, a keyword in upper case), or that is white
// space alone, or a file: URI whose pragma would change the journal the
// module keeps, is a validation error (exit 2) for every command, and no
// file appears in the working directory, even for acquire and run, which
// may create a database (AGENTS_CREATE=1).
func TestCLI_MalformedDSNIsNoFile(t *testing.T) {
	t.Parallel()
	for name, args := range everyCommand {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			a.wd = t.TempDir()
			for dsn, says := range map[string]string{
				"host=127.0.0.1 user=postgres dbname=test sslmode=disable connect_timeout": `"connect_timeout" has no "=" and value`,
				"host=127.0.0.1 stray dbname=test":                                         `"stray" has no "=" and value`,
				"host=127.0.0.1 password='secret dbname=test":                              "opens a quote (') that never closes",
				"HOST=127.0.0.1":                         `"HOST" is not a libpq keyword`,
				" ":                                      "is blank",
				"\n":                                     "is blank",
				"host":                                   `lacks "=value"`,
				"HOSTADDR":                               `lacks "=value"`,
				"\u00a0\u3000":                           "is blank",
				"\u200b":                                 "is blank",
				"agents.db\u00a0":                        "begins or ends with white space",
				"file:x.db?_pragma=journal_mode(delete)": "_journal_mode=DELETE",
			} {
				r := a.runEnv(nil, append([]string{"--json", "--db", dsn}, args...)...)
				if name == "diagnostics" && strings.HasPrefix(dsn, "file:") {
					// Diagnostics reports the refusal as its failed
					// database check (exit 1).
					assert.Equal(t, 1, r.code, "%q: %s", dsn, r.stderr)
					assert.Contains(t, r.stdout, says, "%q", dsn)
					continue
				}
				assert.Equal(t, 2, r.code, "%q: %s", dsn, r.stderr)
				assert.Contains(t, r.stderr, says, "%q", dsn)
				assert.NotContains(t, r.stderr, "secret")
				var doc map[string]map[string]any
				r.decode(t, &doc)
				assert.Equal(t, "validation", doc["error"]["code"], "%q", dsn)
			}
			entries, err := os.ReadDir(a.wd)
			assert.NoError(t, err)
			assert.Empty(t, entries, "a malformed DSN names no file")
		})
	}
}
