//go:build unix

package cli

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_ReadersAsAnotherUser: list and diagnostics, run by a user who is
// not the owner of a lock database that its owner can write (0644), read
// it while the application has it open; while nothing has it open they
// cannot read it without creating files that would keep the owner from
// writing, so they create nothing and say what to do, as docs/cli.md says.
func TestCLI_ReadersAsAnotherUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run agents as another user than the database's owner")
	}
	bin, nobody := unprivilegedAgents(t)
	dir := reachableDir(t)
	a := newAgents(t)
	a.db = dir + "/agents.db"
	a.mustRun("--owner", "ghost", "locks", "acquire", "plan", "held", "--ttl", "1h")
	require.NoError(t, os.Chmod(a.db, 0o644))
	readers := map[string][]string{"list": {"locks", "list"}, "diagnostics": {"diagnostics"}}

	t.Run("NothingHasItOpen", func(t *testing.T) {
		before := snapshot(t, dir)
		for name, args := range readers {
			r, _ := timedRun(t, bin, nobody, append([]string{"--db", a.db}, args...)...)
			assert.Equal(t, 1, r.code, name)
			assert.Contains(t, r.stdout+r.stderr, "inspect it as its owner or as root, or while the application has it open", name)
			assert.Equal(t, before, snapshot(t, dir), name)
		}
	})
	t.Run("TheApplicationHasItOpen", func(t *testing.T) {
		app := openPast(t, a.db) // -wal and -shm exist, 0644 like the database
		defer app.Close()
		r, _ := timedRun(t, bin, nobody, "--db", a.db, "locks", "list")
		assert.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `(?m)^plan +held +ghost `, r.stdout)
		r, _ = timedRun(t, bin, nobody, "--db", a.db, "diagnostics")
		assert.Equal(t, 1, r.code, "the database check fails: this user cannot write it")
		assert.Regexp(t, `(?m)^  ok +active_locks +1 lock held`, r.stdout)
	})
}
