//go:build unix

package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_NoCreateAdviceWhereCreateFails: where --create would fail too,
// acquire and run do not advise it, but say what is wrong (each used to
// advise --create, which then failed).
func TestCLI_NoCreateAdviceWhereCreateFails(t *testing.T) {
	t.Parallel()
	t.Run("DanglingSymlink", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t).unasked()
		link := filepath.Join(a.dir, "agents.db")
		require.NoError(t, os.Symlink(filepath.Join(a.dir, "gone", "agents.db"), link))
		r := a.runEnv(nil, "--db", link, "--owner", "op", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 1, r.code, r.stderr)
		assert.Contains(t, r.stderr, "is a symbolic link to")
		assert.NotContains(t, r.stderr, "--create")
	})
	t.Run("CapitalisedScheme", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t)
		r := a.runEnv(nil, "--db", "Postgres://op@127.0.0.1:1/test", "locks", "list")
		assert.Equal(t, 2, r.code, r.stderr)
		assert.Contains(t, r.stderr, "write the URL's scheme in lower case")
	})
	t.Run("DirectoryThisUserMayNotWrite", func(t *testing.T) {
		t.Parallel()
		bin, nobody := unprivilegedAgents(t)
		if nobody == nil {
			t.Skip("needs root, to run agents as a user who may not write the directory")
		}
		dir := reachableDir(t) // root's, 0755
		db := filepath.Join(dir, "new.db")
		r, _ := timedRun(t, bin, nobody, "--db", db, "--owner", "op", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 1, r.code, r.stderr)
		assert.Contains(t, r.stderr, "this user may not create one in")
		assert.NotContains(t, r.stderr, "--create")
		assert.NoFileExists(t, db)
	})
}
