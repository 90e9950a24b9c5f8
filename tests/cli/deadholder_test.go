//go:build linux

package cli

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

// heldBy waits until the agents process p holds plan/p1 and returns the
// lock as `locks list` shows it.
func heldBy(t *testing.T, a *agents, _ *proc) map[string]any {
	t.Helper()
	var lock map[string]any
	require.Eventually(t, func() bool {
		var all []map[string]any
		r := a.run("--json", "locks", "list")
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &all) != nil || len(all) == 0 {
			return false
		}
		lock = all[0]
		return true
	}, 30*time.Second, 20*time.Millisecond, "agents never took the lock")
	return lock
}

// A holder that dies (SIGKILL) is a process of this machine that is
// provably gone: once its command's group is gone too, another owner takes
// its lock at once, with a larger token, without waiting for the hour-long
// TTL.
func TestCLI_DeadHolderIsTakenOver(t *testing.T) {
	becomeSubreaper(t)
	a := newAgents(t)
	p := a.start("locks", "run", "plan", "p1", "--ttl", "1h", "--", "sleep", "60")
	lock := heldBy(t, a, p)
	_, isProcess := domain.ParseProcessOwner(lock["owner_id"].(string))
	require.True(t, isProcess, "the default owner names its process: %v", lock["owner_id"])

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
	// The group's keeper kills the command; this process reaps them.
	reapGroup(t, groupOf(t, lock))

	// Diagnostics shows the orphan first, and only reads: the database
	// and its WAL keep their digests (WAL readers do mark the -shm).
	before := snapshot(t, a.dir)
	var rep report
	r := a.run("--json", "diagnostics")
	r.decode(t, &rep)
	orphaned := rep.check("orphaned_locks")
	assert.Equal(t, "warn", orphaned.Status, orphaned.Detail)
	require.NotNil(t, orphaned.Count)
	assert.Equal(t, 1, *orphaned.Count)
	after := snapshot(t, a.dir)
	for _, f := range []string{"agents.db", "agents.db-wal"} {
		assert.Equal(t, before[f], after[f], "diagnostics changed %s", f)
	}

	r = a.run("--json", "--owner", "next", "locks", "acquire", "plan", "p1")
	require.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	var got map[string]any
	r.decode(t, &got)
	assert.Greater(t, got["token"].(float64), lock["token"].(float64), "a new, larger token")
	prev, ok := got["took_over_from"].(map[string]any)
	require.True(t, ok, "the JSON names the lock taken over: %s", r.stdout)
	assert.Equal(t, lock["owner_id"], prev["owner_id"])
	assert.Equal(t, lock["token"], prev["token"])
}

// A stopped holder is alive (it may be continued), and an explicit owner
// names no process: neither is taken over before its lock expires.
func TestCLI_LiveOrNamedHolderIsNotTakenOver(t *testing.T) {
	t.Run("Stopped", func(t *testing.T) {
		a := newAgents(t)
		p := a.start("locks", "run", "plan", "p1", "--ttl", "1h", "--", "sleep", "60")
		heldBy(t, a, p)
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
		defer p.cmd.Process.Signal(syscall.SIGCONT)
		r := a.run("--owner", "next", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 3, r.code, "refused: the stopped holder is alive\n%s", r.stderr)
	})
	t.Run("ExplicitOwner", func(t *testing.T) {
		a := newAgents(t)
		p := a.start("--owner", "alice", "locks", "run", "plan", "p1", "--ttl", "1h", "--", "sleep", "60")
		heldBy(t, a, p)
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
		<-p.done
		r := a.run("--owner", "next", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 3, r.code, "refused: alice carries no process to prove gone\n%s", r.stderr)
	})
}
