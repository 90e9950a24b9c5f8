//go:build linux

package cli

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// A stopped agents' command that ignores SIGTERM gets SIGKILL from the
// keeper before the lock's expiry, whatever --grace says: its last write
// (as it timestamps it) comes before the moment another owner, waiting
// through the library, is granted the lock (the new lock's acquired_at,
// on the same machine's clock). The rounds run at once, on databases of
// their own, so that each loads the machine for the others; the test
// compares the order of the two instants, never a duration.
func TestCLIRun_StoppedAgentsCommandKilledBeforeTheExpiry(t *testing.T) {
	becomeSubreaper(t)
	self, err := os.Executable()
	require.NoError(t, err)
	for _, round := range []string{"1", "2", "3", "4"} {
		t.Run(round, func(t *testing.T) {
			t.Parallel()
			stoppedKillRound(t, self)
		})
	}
}

func stoppedKillRound(t *testing.T, self string) {
	a := newAgents(t)
	stamps, pidFile := filepath.Join(a.dir, "stamps"), filepath.Join(a.dir, "pid")
	first := a.start("--owner", "first", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "30s", "--",
		"env", envWriteStamps+"="+stamps, self, pidFile)
	pid := first.awaitPID(pidFile)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGSTOP)) // agents only: not the keeper, not CMD
	t.Cleanup(func() { _ = first.cmd.Process.Signal(syscall.SIGCONT) })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := locks.Open(ctx, locks.Config{Database: a.db, Owner: "second"})
	require.NoError(t, err)
	defer func() { assert.NoError(t, c.Close()) }()
	h, err := c.Locks.Take(ctx, "second", domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"},
		application.AcquireOptions{TTL: 5 * time.Second, Wait: true})
	require.NoError(t, err)
	granted := h.Lock().AcquiredAt

	require.Eventually(t, func() bool { return dead(pid) }, 30*time.Second, 5*time.Millisecond,
		"the stopped agents' command (pid %d) still runs after another owner took its lock", pid)
	last, err := lastStamp(stamps)
	require.NoError(t, err)
	assert.True(t, last.Before(granted),
		"the stopped agents' command wrote at %s, %s after another owner was granted the lock at %s",
		last.Format(time.RFC3339Nano), last.Sub(granted), granted.Format(time.RFC3339Nano))
	t.Logf("the command's last write came %s before the grant", granted.Sub(last))
	_, err = h.Release(ctx)
	require.NoError(t, err)

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGCONT))
	r := first.wait()
	assert.Equal(t, 4, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, "heard of no renewal of the lock before its expiry")
}
