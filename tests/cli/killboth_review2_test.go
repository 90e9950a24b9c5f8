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

// Review 2: docs/cli.md says "Were agents SIGKILLed after its keeper, no
// process of the group outlives it". Killing the keeper and then agents
// (kill -9 KEEPER AGENTS, or with agents stopped so it cannot react) leaves
// every grandchild of CMD running; once the TTL passes another owner
// takes the lock while that work still runs.
func TestCLIRun_Review2_KeeperThenAgentsKilledLeavesWorkRunning(t *testing.T) {
	becomeSubreaper(t)
	a := newAgents(t)
	pidfile := filepath.Join(a.dir, "grandchild")
	p := a.start("locks", "run", "plan", "p1", "--ttl", "5s", "--", "sh", "-c", withGrandchild, pidfile)
	lock := heldBy(t, a, p)
	grandchild := awaitPID(t, pidfile)
	keeper := groupOf(t, lock)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP)) // agents cannot react
	require.NoError(t, syscall.Kill(keeper, syscall.SIGKILL))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
	time.Sleep(6 * time.Second) // past the TTL
	r := a.run("--owner", "next", "locks", "acquire", "plan", "p1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.True(t, dead(grandchild),
		"agents was SIGKILLed after its keeper, yet CMD's grandchild (pid %d) still runs while owner \"next\" holds the lock", grandchild)
}
