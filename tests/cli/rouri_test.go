package cli

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCLI_ReadOnlyURILeavesNothing: acquire and run on a file: URI with
// mode=ro fail, as the store cannot write through it, and leave no file
// beside the database that was not there before (no -wal, -shm, -wake or
// -lock).
func TestCLI_ReadOnlyURILeavesNothing(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"acquire", "run"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			a.mustRun("--owner", "ghost", "locks", "acquire", "plan", "held")
			for _, side := range []string{"-lock", "-wake"} {
				assert.NoError(t, os.Remove(a.db+side)) // nothing has the database open
			}
			before := snapshot(t, a.dir)
			r := a.runEnv(nil, append([]string{"--db", "file:" + a.db + "?mode=ro"}, everyCommand[name]...)...)
			assert.Equal(t, 1, r.code, r.stderr)
			assert.Contains(t, r.stderr, "drop mode=ro")
			assert.Equal(t, before, snapshot(t, a.dir), "no file appears or changes")
		})
	}
}
