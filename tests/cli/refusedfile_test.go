//go:build unix

package cli

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/filestate"
)

// TestCLI_RefusedFileUnchanged runs every command that docs/cli.md says
// refuses a file against each such file, and checks that the file and its
// directory are left byte for byte as they were, journal mode included.
func TestCLI_RefusedFileUnchanged(t *testing.T) {
	t.Parallel()
	commands := map[string][]string{
		"acquire":        {"--owner", "op", "locks", "acquire", "plan", "p1"},
		"acquire-create": {"--owner", "op", "locks", "acquire", "--create", "plan", "p1"},
		"run-create":     {"--owner", "op", "locks", "run", "--create", "plan", "p1", "--", "true"},
		"renew":          {"--owner", "ghost", "locks", "renew", "plan", "held"},
		"release":        {"--owner", "ghost", "locks", "release", "plan", "held"},
		"release-all":    {"--owner", "ghost", "locks", "release-all"},
		"cleanup":        {"locks", "cleanup"},
		"list":           {"locks", "list", "--all"},
		"diagnostics":    {"diagnostics"},
	}
	// seedLockDB makes a lock database at path, closed, with an active
	// lock of owner ghost on plan/held.
	seedLockDB := func(t *testing.T, path string) {
		r := newAgents(t).runEnv(nil, "--db", path, "--owner", "ghost", "locks", "acquire", "plan", "held", "--ttl", "1h")
		require.Equal(t, 0, r.code, r.stderr)
	}
	bin, nobody := unprivilegedAgents(t)
	cases := []struct {
		name string
		// make makes the file in dir; it returns the --db value and the
		// file it names.
		make func(t *testing.T, dir string) (db, file string)
		// works lists the commands that do not refuse the file (they
		// must leave it unchanged all the same).
		works []string
		// want is in the message of each refusal (but diagnostics').
		want     string
		asNobody bool
	}{
		{name: "NotADatabase", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "notes.txt")
			writeFile(t, p, "these are not the locks you are looking for\n")
			return p, p
		}, want: "not a valid database"},
		{name: "ALocksTableOfItsOwn", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.AppFile(t, p, "CREATE TABLE locks (name TEXT, holder TEXT); INSERT INTO locks VALUES ('door', 'ann')")
			return p, p
		}, want: "a locks table that the lock "},
		{name: "ALocksTableAndOtherTables", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.AppFile(t, p, "CREATE TABLE users (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT); "+
				"CREATE TABLE locks (name TEXT, holder TEXT); INSERT INTO users (name) VALUES ('ann')")
			return p, p
		}, want: "a locks table that the lock "},
		{name: "OtherTablesOnly", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.AppFile(t, p, "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('keep me')")
			return p, p
		}, want: "check --db"},
		// Read through a connection that may write, these would change:
		// the commits of the -wal copied into the file, the journal
		// rolled back.
		{name: "WALWithoutItsIndex", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.WALWithoutIndex(t, p, "CREATE TABLE locks (a, b); INSERT INTO locks VALUES (1, 2)")
			return p, p
		}, want: "-shm file, the index by which SQLite reads them, is missing"},
		{name: "WALWithoutItsIndexOtherTables", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.WALWithoutIndex(t, p, "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me')")
			return p, p
		}, want: "-shm file, the index by which SQLite reads them, is missing"},
		{name: "HotJournal", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.HotJournal(t, p)
			return p, p
		}, want: "a program stopped in the middle of a transaction"},
		{name: "LockDatabaseHardLinked", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "agents.db")
			seedLockDB(t, p)
			require.NoError(t, os.Link(p, filepath.Join(dir, "other.db")))
			return filepath.Join(dir, "other.db"), p
		}, want: "hard links"},
		{name: "ReadOnlyURI", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "agents.db")
			seedLockDB(t, p)
			return "file:" + p + "?mode=ro", p
		}, works: []string{"list"}, want: "mode=ro"},
		{name: "ReadOnlyFileUnprivileged", make: func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "agents.db")
			seedLockDB(t, p)
			require.NoError(t, os.Chmod(p, 0o444))
			return p, p
		}, works: []string{"list"}, want: "read-only", asNobody: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := reachableDir(t)
			db, file := tc.make(t, dir)
			for name, args := range commands {
				before := filestate.Of(t, dir, file)
				var r result
				if tc.asNobody {
					r, _ = timedRun(t, bin, nobody, append([]string{"--db", db}, args...)...)
				} else {
					r, _ = timedRun(t, agentsBin, (*syscall.Credential)(nil), append([]string{"--db", db}, args...)...)
				}
				assert.Equal(t, before, filestate.Of(t, dir, file), "%s changed the file: exit %d\nstdout: %s\nstderr: %s", name, r.code, r.stdout, r.stderr)
				if slices.Contains(tc.works, name) {
					assert.Equal(t, 0, r.code, "%s: %s", name, r.stderr)
					continue
				}
				assert.Equal(t, 1, r.code, "%s must refuse the file\nstdout: %s\nstderr: %s", name, r.stdout, r.stderr)
				if name != "diagnostics" {
					assert.Contains(t, r.stderr, tc.want, name)
				}
			}
		})
	}
}

// TestCLI_HardLinkedDatabase: A holds plan/p1 through a.db; B, through a
// hard link b.db, must not be told that it acquired it too. Each name
// would get its own -wal and -shm, so the names would be two databases.
// Every command refuses either name while the file has two, and says what
// to do.
func TestCLI_HardLinkedDatabase(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1")
	b := filepath.Join(a.dir, "b.db")
	require.NoError(t, os.Link(a.db, b))
	before := snapshot(t, a.dir)

	for _, db := range []string{b, a.db} {
		r := a.runEnv(nil, "--db", db, "--owner", "B", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 1, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
		assert.NotContains(t, r.stdout, "Acquired")
		assert.Contains(t, r.stderr, db+" has 2 names (hard links)")
		assert.Contains(t, r.stderr, "two names are two databases")
		assert.Contains(t, r.stderr, "use one name for the database file in every program that opens it, and remove the other names (find them with: find / -xdev -samefile "+db+")")

		r = a.runEnv(nil, "--db", db, "--json", "--owner", "B", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 1, r.code)
		assertError(t, r, "internal")

		r = a.runEnv(nil, "--db", db, "locks", "list")
		assert.Equal(t, 1, r.code, "a second name would list what its own journal holds: %s", r.stdout)
		assert.Contains(t, r.stderr, "hard links")
	}
	assert.Equal(t, before, snapshot(t, a.dir), "no -wal or -shm for the second name, nothing changed")

	// Once the other name is gone, the database works again, with A's lock.
	require.NoError(t, os.Remove(b))
	r := a.run("--owner", "B", "locks", "acquire", "plan", "p1")
	assert.Equal(t, 3, r.code, "A still holds it: %s", r.stderr)
}

// TestCLI_HardLinkedWhileHeld: A holds plan/p1 through a.db in a process
// that has the file open (its journal is a.db-wal); B runs agents through
// a hard link b.db made meanwhile, and must not be told it acquired it.
func TestCLI_HardLinkedWhileHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newAgents(t)
	a.mustRun("--owner", "A", "locks", "acquire", "plan", "setup") // the database exists
	holder, err := locks.Open(ctx, locks.Config{Database: a.db, Owner: "A"})
	require.NoError(t, err)
	defer holder.Close()
	held, err := holder.Locks.Acquire(ctx, "A", domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, time.Hour)
	require.NoError(t, err)
	b := filepath.Join(a.dir, "b.db")
	require.NoError(t, os.Link(a.db, b))

	r := a.runEnv(nil, "--db", b, "--owner", "B", "locks", "acquire", "plan", "p1")
	assert.Equal(t, 1, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	assert.NotContains(t, r.stdout, "Acquired")
	assert.Contains(t, r.stderr, "has 2 names (hard links)")
	assert.NoFileExists(t, b+"-wal", "no journal of its own for the second name")

	got, err := holder.Locks.Get(ctx, held.Resource)
	require.NoError(t, err)
	assert.Equal(t, held.Token, got.Token)
}
