//go:build linux

package cli

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stoppedBound is how long past the lock's expiry the test lets the
// stopped agents' command live: the keeper stops it a fifth of the TTL
// before (1 s for these 5 s locks), so this is slack for a loaded
// machine, not a delay the design allows.
const stoppedBound = time.Second

// notAlive is the second owner's command: it writes each pid of "$0" that
// still runs (not gone, not a zombie) to "$1", then "ran" to "$2".
const notAlive = `pids=$0 alive=$1 ran=$2
for p in $(cat "$pids"); do
	s=$(cat /proc/$p/stat 2>/dev/null) || continue
	s=${s##*)}
	set -- $s
	[ "$1" = Z ] || echo "$p $1" >> "$alive"
done
echo ran > "$ran"`

// An agents that is stopped (SIGSTOP) while its command runs renews
// nothing, and the lock lapses: the keeper of the command's group, which
// hears no renewal and no heartbeat, stops the group before the lock's
// expiry, so that another owner's "locks run --wait", which takes the
// lock at the expiry, never runs while a process of the first command is
// alive. Continued, agents reports the loss (exit 4).
func TestCLIRun_StoppedAgentsCommandStopsBeforeTheExpiry(t *testing.T) {
	becomeSubreaper(t)
	a := newAgents(t)
	pids := filepath.Join(a.dir, "pids")
	first := a.start("--json", "--owner", "first", "locks", "run", "plan", "p1", "--ttl", "5s", "--",
		"sh", "-c", `sleep 1000 & echo "$$ $!" > "$0"; wait`, pids)
	heldBy(t, a, first)
	work := first.awaitPIDs(pids)

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGSTOP)) // agents only: not the keeper, not CMD
	t.Cleanup(func() { _ = first.cmd.Process.Signal(syscall.SIGCONT) })
	lock := heldBy(t, a, first) // as last renewed: nothing renews it now
	expires, err := time.Parse(time.RFC3339Nano, lock["expires_at"].(string))
	require.NoError(t, err)

	alive, ran := filepath.Join(a.dir, "alive"), filepath.Join(a.dir, "ran")
	second := a.start("--owner", "second", "locks", "run", "plan", "p1", "--ttl", "5s", "--wait", "--timeout", "30s", "--",
		"sh", "-c", notAlive, pids, alive, ran)
	var deadAt time.Time
	require.Eventually(t, func() bool {
		for _, pid := range work {
			if !dead(pid) {
				return false
			}
		}
		deadAt = time.Now()
		return true
	}, 30*time.Second, 10*time.Millisecond, "the stopped agents' command (pids %v) still runs %s after its lock expired at %s",
		work, 30*time.Second, expires)
	t.Logf("the first command ended %s before its lock's expiry", expires.Sub(deadAt))
	r := second.wait()
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.FileExists(t, ran, "the second owner's command ran")
	got, _ := os.ReadFile(alive)
	assert.Empty(t, string(got), "the second owner's command ran while these processes of the first one were alive (pid state)")
	assert.False(t, deadAt.After(expires.Add(stoppedBound)),
		"the first command ended at %s, more than %s after its lock's expiry at %s", deadAt, stoppedBound, expires)
	assert.False(t, deadAt.Before(expires.Add(-2*time.Second)),
		"the first command ended at %s, before the keeper's lead (1 s) before the expiry at %s", deadAt, expires)

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGCONT))
	contAt := time.Now()
	r = first.wait()
	t.Logf("agents ended %s after SIGCONT; stderr:\n%s", time.Since(contAt), r.stderr)
	assert.Equal(t, 4, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, "heard of no renewal of the lock before its expiry")
	var doc runDoc
	r.decode(t, &doc)
	require.NotNil(t, doc.Lost, "stdout: %s", r.stdout)
	assert.Contains(t, []string{"expired", "taken_over"}, doc.Lost.Reason)
	assert.False(t, doc.Released)
}

// A live agents renews its lock, and beats: its keeper never stops the
// command, however many times the TTL passes.
func TestCLIRun_LiveAgentsKeepsItsCommand(t *testing.T) {
	a := newAgents(t)
	r := a.run("--owner", "first", "locks", "run", "plan", "p1", "--ttl", "5s", "--", "sleep", "7")
	assert.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	assert.Empty(t, r.stderr)
}
