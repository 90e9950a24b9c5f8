package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_BadInput runs each bad input against an existing database that
// holds an active and an expired lock, so that any startup cleanup or
// migration would show in its bytes, and checks that it is left unchanged.
func TestCLI_BadInput(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	a.mustRun("--owner", "A", "locks", "acquire", "plan", "live")
	seedExpired(t, a.db, "stale")
	before := snapshot(t, a.dir)

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"UnknownType", []string{"--owner", "A", "locks", "acquire", "job", "p1"},
			`invalid resource_type: "job" is not a resource type; use "plan" or "project"`},
		{"EmptyID", []string{"--owner", "A", "locks", "acquire", "plan", ""},
			"invalid resource_id: must not be empty"},
		{"ID256Bytes", []string{"--owner", "A", "locks", "acquire", "plan", strings.Repeat("x", 256)},
			"invalid resource_id: is 256 bytes long; the limit is 255 bytes"},
		{"TTL4s", []string{"--owner", "A", "locks", "acquire", "plan", "p1", "--ttl", "4s"},
			`invalid argument "4s" for "--ttl" flag: the TTL must be from 5s to 1h; omit --ttl for the default 5m`},
		{"TTL2h", []string{"--owner", "A", "locks", "renew", "plan", "live", "--ttl", "2h"},
			`invalid argument "2h" for "--ttl" flag: the TTL must be from 5s to 1h`},
		{"MissingOwner", []string{"locks", "acquire", "plan", "p1"},
			"missing owner: pass --owner ID or set AGENTS_OWNER"},
		{"MissingOwnerReleaseAll", []string{"locks", "release-all"},
			"missing owner: pass --owner ID or set AGENTS_OWNER"},
		{"UnknownFlag", []string{"locks", "list", "--since", "1h"},
			"unknown flag: --since"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := a.run(tc.args...)
			assert.Equal(t, 2, r.code)
			assert.Contains(t, r.stderr, tc.want)
			assert.Empty(t, r.stdout)

			r = a.run(append([]string{"--json"}, tc.args...)...)
			assert.Equal(t, 2, r.code)
			assertError(t, r, "validation")

			assert.Equal(t, before, snapshot(t, a.dir), "the database must be left unchanged")
		})
	}

	t.Run("DatabaseInMissingDirectory", func(t *testing.T) {
		missing := filepath.Join(a.dir, "no", "such", "dir", "agents.db")
		r := a.runEnv(nil, "--db", missing, "--owner", "A", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 1, r.code)
		assert.Contains(t, r.stderr, "cannot be reached; check the path or DSN and that the directory exists")
		assert.Contains(t, r.stderr, missing)
		// The commands that do not create a database refuse it before any
		// directory matters.
		for _, args := range [][]string{{"locks", "list"}, {"locks", "cleanup"}} {
			r := a.runEnv(nil, append([]string{"--db", missing}, args...)...)
			assert.Equal(t, 1, r.code, "%v", args)
			assert.Contains(t, r.stderr, "there is no lock database at "+missing)
		}
		r = a.runEnv([]string{"AGENTS_DB=" + missing}, "--json", "diagnostics")
		assert.Equal(t, 1, r.code)
		var rep report
		r.decode(t, &rep)
		assert.Contains(t, rep.check("database").Detail, "there is no database at "+missing)
		assert.NoDirExists(t, filepath.Join(a.dir, "no"), "nothing creates a directory for --db")
		assert.Equal(t, before, snapshot(t, a.dir))
	})

	t.Run("FileThatIsNotADatabase", func(t *testing.T) {
		dir := t.TempDir()
		notDB := filepath.Join(dir, "notes.txt")
		writeFile(t, notDB, "these are not the locks you are looking for\n")
		want := snapshot(t, dir)
		for _, args := range [][]string{
			{"--owner", "A", "locks", "acquire", "plan", "p1"},
			{"locks", "list", "--all"},
			{"locks", "cleanup"},
		} {
			r := a.runEnv(nil, append([]string{"--db", notDB}, args...)...)
			assert.Equal(t, 1, r.code, "%v", args)
			assert.Contains(t, r.stderr, "lock store is not a valid database; point the service at the right file, or move the damaged file away")
			assert.Contains(t, r.stderr, notDB)

			r = a.runEnv(nil, append([]string{"--json", "--db", notDB}, args...)...)
			assertError(t, r, "internal")
		}
		r := a.runEnv(nil, "--db", notDB, "diagnostics")
		assert.Equal(t, 1, r.code)
		assert.Regexp(t, `(?m)^  fail +database +.*notes.txt is not a SQLite database`, r.stdout)
		assert.Equal(t, want, snapshot(t, dir), "the file must be left as it was, with nothing beside it")
	})
}

// TestCLI_DefaultDatabase runs without --db or AGENTS_DB: the database is
// created under the XDG data directory, private to the user.
func TestCLI_DefaultDatabase(t *testing.T) {
	t.Parallel()
	a := newAgents(t).unasked()
	data := filepath.Join(a.dir, "data")

	r := a.runEnv(nil, "diagnostics")
	assert.Equal(t, 1, r.code)
	assert.NoDirExists(t, data, "diagnostics creates nothing")

	r = a.runEnv(nil, "locks", "list")
	assert.Equal(t, 1, r.code)
	// The user passed no --db: the message says the default database does
	// not exist yet, and what creates it, not "check --db".
	assert.Contains(t, r.stderr, "there is no lock database yet at the default path "+filepath.Join(data, "cleveragents", "agents.db"))
	assert.Contains(t, r.stderr, "the first 'agents locks acquire' or 'agents locks run' creates it")
	assert.NotContains(t, r.stderr, "check --db")
	assert.NoDirExists(t, data, "only the commands that take a lock create the database")
	r = a.runEnv(nil, "diagnostics")
	assert.NotContains(t, r.stdout, "check --db")
	assert.Contains(t, r.stdout, "there is no lock database yet at the default path")

	r = a.runEnv(nil, "--owner", "A", "locks", "acquire", "plan", "p1")
	require.Equal(t, 0, r.code, r.stderr)
	for path, mode := range map[string]os.FileMode{
		filepath.Join(data, "cleveragents"):              0o700,
		filepath.Join(data, "cleveragents", "agents.db"): 0o600,
	} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, mode, fi.Mode().Perm(), path)
	}
	r = a.runEnv(nil, "diagnostics")
	assert.Equal(t, 0, r.code, r.stdout)
	assert.Contains(t, r.stdout, "Diagnostics of "+filepath.Join(data, "cleveragents", "agents.db"))
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

// TestCLI_InMemoryDatabase: an in-memory SQLite database, in any of its
// spellings, is a usage error for every command that says why (it lives
// and dies with one process) and what to pass instead; it never advises
// --create, which could not help.
func TestCLI_InMemoryDatabase(t *testing.T) {
	t.Parallel()
	for name, args := range everyCommand {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAgents(t).unasked()
			a.wd = t.TempDir()
			for _, db := range []string{":memory:", "file::memory:", "file:x.db?mode=memory", "file:x?vfs=memdb"} {
				for _, create := range [][]string{nil, {"AGENTS_CREATE=1"}} {
					r := a.runEnv(create, append([]string{"--db", db}, args...)...)
					assert.Equal(t, 2, r.code, "%s: %s", db, r.stderr)
					assert.Contains(t, r.stderr, "in-memory SQLite database", db)
					assert.Contains(t, r.stderr, "cannot be shared between processes", db)
					assert.Contains(t, r.stderr, "postgres://", db)
					assert.NotContains(t, r.stderr, "--create", db)
				}
			}
			entries, err := os.ReadDir(a.wd)
			require.NoError(t, err)
			assert.Empty(t, entries)
		})
	}
}
