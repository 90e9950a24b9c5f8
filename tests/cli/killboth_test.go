//go:build linux

package cli

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The keeper SIGKILLed while agents is stopped, then agents SIGKILLed:
// neither can stop CMD's group any more, and CMD's grandchildren run on
// (docs/cli.md says so). What still holds: the lock is not a dead
// holder's while any process of the group lives, so another owner is
// refused before the TTL; once the group is gone, it takes the lock over.
func TestCLIRun_KeeperThenAgentsKilledRefusesWhileTheGroupLives(t *testing.T) {
	becomeSubreaper(t)
	a := newAgents(t)
	pidfile := filepath.Join(a.dir, "grandchild")
	p := a.start("locks", "run", "plan", "p1", "--ttl", "1h", "--", "sh", "-c", withGrandchild, pidfile)
	lock := heldBy(t, a, p)
	grandchild := awaitPID(t, pidfile)
	group := groupOf(t, lock)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP)) // agents cannot react
	require.NoError(t, syscall.Kill(group, syscall.SIGKILL))  // the keeper
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
	r := a.run("--owner", "next", "locks", "acquire", "plan", "p1")
	assert.Equal(t, 3, r.code, "refused while a process of the group lives\n%s", r.stderr)
	assert.False(t, dead(grandchild), "the grandchild runs on: nothing is left to stop it")

	require.NoError(t, syscall.Kill(grandchild, syscall.SIGKILL))
	reapGroup(t, group)
	r = a.run("--owner", "next", "locks", "acquire", "plan", "p1")
	assert.Equal(t, 0, r.code, "taken over once the group is gone\n%s", r.stderr)
}
