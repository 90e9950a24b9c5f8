package cli

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runFull runs agents with --db set and stdout on /dev/full, where every
// write fails with ENOSPC, as on a full disk.
func (a *agents) runFull(args ...string) result {
	a.t.Helper()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		a.t.Skip("this system has no /dev/full")
	}
	require.NoError(a.t, err)
	defer full.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentsBin, append([]string{"--db", a.db}, args...)...)
	cmd.Env = slices.Clone(a.env)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = full, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(a.t, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stderr: stderr.String()}
}

// TestCLI_StdoutFull runs commands whose output cannot be written: each
// must exit 1 and say so on stderr, since a script that reads the output
// must not take a lost result for success.
func TestCLI_StdoutFull(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1")
	for _, args := range [][]string{
		{"--owner", "A", "locks", "acquire", "plan", "p2"},
		{"--json", "--owner", "A", "locks", "acquire", "plan", "p3"},
		{"--owner", "A", "locks", "renew", "plan", "p1"},
		{"--owner", "A", "locks", "release", "plan", "p3"},
		{"--owner", "A", "locks", "release-all"},
		{"locks", "list"},
		{"locks", "cleanup"},
		{"diagnostics"},
		{"-h"},
	} {
		r := a.runFull(args...)
		assert.Equal(t, 1, r.code, "agents %v\nstderr: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "cannot write the output: write /dev/stdout: no space left on device", "agents %v", args)
	}
	var ls []lock
	a.mustRun("--json", "locks", "list").decode(t, &ls)
	assert.Empty(t, ls, "the commands ran: release-all released p1 and p2")

	a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1")
	r := a.runFull("--owner", "B", "locks", "acquire", "plan", "p1")
	assert.Equal(t, 3, r.code, "a conflict stays exit 3")
}
