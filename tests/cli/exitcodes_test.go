//go:build unix

package cli

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCLIRun_ExitCodeFlags: --conflict-exit-code and --lost-exit-code let
// a script tell agents' conflict and lost lock from a CMD that itself
// exits 3 or 4; without them the codes stay 3 and 4.
func TestCLIRun_ExitCodeFlags(t *testing.T) {
	t.Parallel()
	t.Run("Conflict", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t)
		a.mustRun("--owner", "other", "locks", "acquire", "plan", "p1")
		r := a.run("--owner", "me", "locks", "run", "plan", "p1", "--conflict-exit-code", "75", "--", "true")
		assert.Equal(t, 75, r.code, "stderr: %s", r.stderr)
		assert.Contains(t, r.stderr, `held by another owner: "other"`)
		r = a.run("--json", "--owner", "me", "locks", "run", "plan", "p1", "--conflict-exit-code=0", "--", "true")
		assert.Equal(t, 0, r.code, "flock -E 0: skip quietly; stderr: %s", r.stderr)
		var doc map[string]map[string]any
		r.decode(t, &doc)
		assert.Equal(t, "conflict", doc["error"]["code"], "the JSON code stays conflict")
		r = a.run("--owner", "me", "locks", "run", "plan", "p1", "--", "true")
		assert.Equal(t, 3, r.code, "the default is unchanged; stderr: %s", r.stderr)
	})
	t.Run("CommandsOwnCodesStayApart", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t)
		for _, code := range []string{"3", "4"} {
			r := a.run("--owner", "me", "locks", "run", "plan", "p1", "--conflict-exit-code", "75", "--lost-exit-code", "76",
				"--", "sh", "-c", "exit "+code)
			assert.Equal(t, code, strconv.Itoa(r.code), "CMD's own code; stderr: %s", r.stderr)
		}
	})
	// The lock is lost without waiting for its TTL: released by hand, as
	// its owner, which the next renewal (after ttl/2) finds.
	for _, tc := range []struct {
		name  string
		flags []string
		want  int
	}{
		{"Lost", []string{"--lost-exit-code", "76"}, 76},
		{"LostDefault", nil, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			ready, term := filepath.Join(a.dir, "ready"), filepath.Join(a.dir, "term")
			args := append([]string{"--owner", "runner", "locks", "run", "plan", "p1", "--ttl", "5s", "--conflict-exit-code", "75"}, tc.flags...)
			p := a.start(append(args, "--", "sh", "-c", stopsOnTerm, ready, term)...)
			p.awaitPID(ready)
			a.mustRun("--owner", "runner", "locks", "release", "plan", "p1")
			r := p.wait()
			assert.Equal(t, tc.want, r.code, "stderr: %s", r.stderr)
			assert.FileExists(t, term, "the command got SIGTERM, and exited 0")
		})
	}
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t)
		for _, flags := range [][]string{
			{"--conflict-exit-code", "256"}, {"--conflict-exit-code", "-1"}, {"--conflict-exit-code", "x"},
			{"--conflict-exit-code", "1"}, {"--conflict-exit-code", "2"}, {"--conflict-exit-code", "126"},
			{"--lost-exit-code", "127"}, {"--lost-exit-code", "0"},
			{"--conflict-exit-code", "4"}, {"--lost-exit-code", "3"},
			{"--conflict-exit-code", "9", "--lost-exit-code", "9"},
		} {
			r := a.run(append([]string{"--owner", "me", "locks", "run", "plan", "p1"}, append(flags, "--", "true")...)...)
			assert.Equal(t, 2, r.code, "%v: %s", flags, r.stderr)
			assert.Empty(t, r.stdout)
		}
		assert.NoFileExists(t, a.db, "a refused flag opens nothing")
	})
}
