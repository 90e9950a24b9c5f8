//go:build linux

package cli

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A member of CMD's group that ignores SIGTERM, which CMD itself obeys:
// once the lock is lost, agents waits past CMD's end for the whole group,
// SIGKILLs what is left --grace after the SIGTERM, and only then exits 4.
// No process of the work runs on after agents, while another owner may
// hold the lock.
func TestCLIRun_LostLockWaitsForTheWholeGroup(t *testing.T) {
	becomeSubreaper(t)
	a := newAgents(t)
	pidfile := filepath.Join(a.dir, "grandchild")
	script := `(trap "" TERM; exec sleep 1000) & echo $! > "$0"; wait`
	p := a.start("--owner", "X", "--json", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "1s",
		"--", "sh", "-c", script, pidfile)
	heldBy(t, a, p)
	grandchild := p.awaitPID(pidfile)

	lostAt := time.Now()
	a.mustRun("--owner", "X", "locks", "release", "plan", "p1") // the lock is lost: removed
	r := p.wait()
	took := time.Since(lostAt)
	assert.Equal(t, 4, r.code, "stderr: %s", r.stderr)
	assert.True(t, dead(grandchild), "a member of CMD's group outlived agents, which exited 4 after the loss\nstderr: %s", r.stderr)
	assert.Contains(t, r.stderr, "processes of its group were still running 1s after it was signalled: sending them SIGKILL")
	// --grace 1s, and slack for a loaded machine: not "forever".
	assert.Less(t, took, 15*time.Second, "the member ran on long past --grace")
}

// A forwarded SIGTERM that CMD obeys and a member of its group ignores:
// agents waits for the member, SIGKILLs it --grace after CMD's end, and
// only then releases the lock.
func TestCLIRun_ForwardedSignalWaitsForTheWholeGroup(t *testing.T) {
	becomeSubreaper(t)
	a := newAgents(t)
	pidfile := filepath.Join(a.dir, "grandchild")
	script := `(trap "" TERM; exec sleep 1000) & echo $! > "$0"; wait`
	p := a.start("--owner", "X", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "1s",
		"--", "sh", "-c", script, pidfile)
	heldBy(t, a, p)
	grandchild := p.awaitPID(pidfile)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	r := p.wait()
	assert.Equal(t, 128+int(syscall.SIGTERM), r.code, "stderr: %s", r.stderr)
	assert.True(t, dead(grandchild), "a member of CMD's group outlived agents after a forwarded SIGTERM\nstderr: %s", r.stderr)
	assert.Contains(t, r.stderr, "processes of its group still run: SIGKILL in 1s")
	assert.Empty(t, a.holders(), "the lock is released once the whole group is gone")
}
