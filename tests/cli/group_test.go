//go:build linux

package cli

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

// The work that "locks run" guards is CMD and every process it starts:
// they run in a process group of their own, which agents signals as a
// whole, and the lock is not a dead holder's while the group has members.

// withGrandchild is a CMD that starts a grandchild, writes its pid to "$0",
// and waits for it.
const withGrandchild = `sleep 1000 & echo $! > "$0"; wait`

// becomeSubreaper makes this test process the reaper of its descendants'
// orphans, as init is on most machines: this machine's pid 1 may reap
// nothing, and an unreaped zombie is still a member of its group.
func becomeSubreaper(t *testing.T) {
	t.Helper()
	const prSetChildSubreaper = 36
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	require.Zero(t, errno, "prctl(PR_SET_CHILD_SUBREAPER)")
}

// reapGroup reaps the members of process group pgid that became this
// process's orphans, until the group is empty.
func reapGroup(t *testing.T, pgid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for {
			pid, err := syscall.Wait4(-pgid, nil, syscall.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
		}
		return syscall.Kill(-pgid, 0) == syscall.ESRCH
	}, 30*time.Second, 10*time.Millisecond, "process group %d never emptied", pgid)
}

// groupOf returns the process group that the owner id of a lock names.
func groupOf(t *testing.T, lock map[string]any) int {
	t.Helper()
	p, ok := domain.ParseProcessOwner(lock["owner_id"].(string))
	require.True(t, ok, "the default owner names its process: %v", lock["owner_id"])
	require.NotZero(t, p.Group, "the owner names the group of the command: %v", lock["owner_id"])
	return p.Group
}

// When agents dies (SIGKILL), the whole work dies with it; until every
// process of it has ended, another owner is refused, and then takes the
// lock over at once.
func TestCLI_DeadHolderWorkOutlivesAgents(t *testing.T) {
	becomeSubreaper(t)
	t.Run("AgentsKilled", func(t *testing.T) {
		a := newAgents(t)
		pidfile := filepath.Join(a.dir, "grandchild")
		p := a.start("locks", "run", "plan", "p1", "--ttl", "1h", "--", "sh", "-c", withGrandchild, pidfile)
		lock := heldBy(t, a, p)
		grandchild := p.awaitPID(pidfile)
		pgid, err := syscall.Getpgid(grandchild)
		require.NoError(t, err)
		assert.Equal(t, groupOf(t, lock), pgid, "the command's children run in the group the owner names")

		require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
		<-p.done
		// The grandchild is alive, or a zombie not yet reaped: either way
		// a member of the work's group.
		r := a.run("--owner", "next", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 3, r.code, "refused while the command's group has members\n%s", r.stderr)
		assert.Eventually(t, func() bool { return dead(grandchild) }, 10*time.Second, 10*time.Millisecond,
			"the grandchild outlived agents")

		reapGroup(t, groupOf(t, lock))
		r = a.run("--json", "--owner", "next", "locks", "acquire", "plan", "p1")
		require.Equal(t, 0, r.code, "taken over once the group is gone\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
		var got map[string]any
		r.decode(t, &got)
		prev, ok := got["took_over_from"].(map[string]any)
		require.True(t, ok, "the JSON names the lock taken over: %s", r.stdout)
		assert.Equal(t, lock["owner_id"], prev["owner_id"])
	})
	t.Run("AgentsAndItsWatcherKilled", func(t *testing.T) {
		// The OOM killer takes agents and the process that would stop the
		// group: CMD still gets its parent-death signal, and the
		// grandchild runs on. Its lock is not a dead holder's.
		a := newAgents(t)
		pidfile := filepath.Join(a.dir, "grandchild")
		p := a.start("locks", "run", "plan", "p1", "--ttl", "1h", "--", "sh", "-c", withGrandchild, pidfile)
		lock := heldBy(t, a, p)
		grandchild := p.awaitPID(pidfile)
		group := groupOf(t, lock)

		// Both die as one: agents, stopped first, cannot act on its
		// keeper's death (it would kill the group, as it should when it
		// outlives the keeper) between the two kills.
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
		awaitStopped(t, p.cmd.Process.Pid)
		require.NoError(t, syscall.Kill(group, syscall.SIGKILL)) // the keeper, the group's first process
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
		<-p.done
		r := a.run("--owner", "next", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 3, r.code, "refused while the grandchild lives\n%s", r.stderr)
		assert.False(t, dead(grandchild), "the grandchild is alive")

		require.NoError(t, syscall.Kill(grandchild, syscall.SIGKILL))
		reapGroup(t, group)
		r = a.run("--owner", "next", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 0, r.code, "taken over once the grandchild is gone\n%s", r.stderr)
	})
}

// SIGINT and SIGTERM sent to agents reach every process of CMD's group,
// and a lost lock stops the whole group: SIGTERM, then SIGKILL after
// --grace.
func TestCLIRun_SignalsReachTheGroup(t *testing.T) {
	t.Parallel()
	t.Run("Forwarded", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t)
		pidfile := filepath.Join(a.dir, "grandchild")
		p := a.start("--owner", "alice", "locks", "run", "plan", "p1", "--", "sh", "-c", withGrandchild, pidfile)
		grandchild := p.awaitPID(pidfile)
		p.signal(syscall.SIGTERM)
		r := p.wait()
		assert.Equal(t, 128+15, r.code, "stderr: %s", r.stderr)
		assert.Eventually(t, func() bool { return dead(grandchild) }, 10*time.Second, 10*time.Millisecond,
			"the grandchild got SIGTERM too")
	})
	t.Run("LostLock", func(t *testing.T) {
		t.Parallel()
		// Agents SIGKILLs the whole group once --grace has passed, its
		// keeper with it: that is agents' own doing, not a keeper that was
		// killed behind its back, and must not be reported as one ("the
		// keeper ... was killed by SIGKILL ...; run the command again").
		// Whether agents hears of the keeper's death before CMD's is a
		// race, so several rounds run at once.
		for _, round := range []string{"1", "2", "3", "4"} {
			t.Run(round, func(t *testing.T) {
				t.Parallel()
				a := newAgents(t)
				pidfile := filepath.Join(a.dir, "grandchild")
				p := a.start("--json", "--owner", "runner", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "1s", "--",
					"sh", "-c", `trap '' TERM; `+withGrandchild, pidfile)
				grandchild := p.awaitPID(pidfile)
				a.mustRun("--owner", "runner", "locks", "release", "plan", "p1")
				a.mustRun("--owner", "other", "locks", "acquire", "plan", "p1")
				r := p.wait()
				assert.Equal(t, 4, r.code, "stderr: %s", r.stderr)
				assert.Contains(t, r.stderr, "was still running 1s after SIGTERM: sending SIGKILL")
				assert.NotContains(t, r.stderr, "keeper of the command's process group")
				assert.NotContains(t, r.stderr, "run the command again")
				var doc runDoc
				r.decode(t, &doc)
				require.NotNil(t, doc.Lost)
				// Removed, if the keeper heard of the release before the acquire.
				assert.Contains(t, []string{"removed", "taken_over"}, doc.Lost.Reason)
				assert.Eventually(t, func() bool { return dead(grandchild) }, 10*time.Second, 10*time.Millisecond,
					"the grandchild got SIGKILL too")
			})
		}
	})
}
