//go:build linux

package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
	grandchild := p.awaitPID(pidfile)
	group := groupOf(t, lock)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP)) // agents cannot react
	awaitStopped(t, p.cmd.Process.Pid)
	require.NoError(t, syscall.Kill(group, syscall.SIGKILL)) // the keeper
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

// awaitStopped waits until every thread of process pid has stopped. kill
// returns before they have: a thread that is running on another CPU runs
// on until it next enters the kernel, and may see the keeper die first.
func awaitStopped(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return false
		}
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				return false
			}
			s := string(b)
			if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) == 0 || f[0] != "T" {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "agents (pid %d) never stopped", pid)
}
