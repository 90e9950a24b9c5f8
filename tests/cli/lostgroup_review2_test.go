//go:build linux

package cli

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Review 2: when the lock is lost, --grace promises that "CMD (and every
// process of its group)" gets SIGKILL if still running --grace after
// SIGTERM. If CMD itself dies on SIGTERM but a member of its group ignores
// SIGTERM, supervise returns as soon as CMD is reaped, the SIGKILL timer is
// dropped, the keeper is told 'd' and exits, and the member runs on
// forever, unprotected, while another owner holds the lock.
func TestCLIRun_Review2_LostLockGroupMemberIgnoringTERMSurvivesGrace(t *testing.T) {
	becomeSubreaper(t)
	a := newAgents(t)
	pidfile := filepath.Join(a.dir, "grandchild")
	// The grandchild ignores SIGTERM; CMD (sh) dies of it.
	script := `(trap "" TERM; exec sleep 1000) & echo $! > "$0"; wait`
	p := a.start("--owner", "X", "--json", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "1s",
		"--", "sh", "-c", script, pidfile)
	heldBy(t, a, p)
	grandchild := awaitPID(t, pidfile)

	// The lock is lost: removed from the store.
	a.mustRun("--owner", "X", "locks", "release", "plan", "p1")
	r := p.wait()
	assert.Equal(t, 4, r.code, "stderr: %s", r.stderr)
	// Another owner now holds the resource.
	a.mustRun("--owner", "other", "locks", "acquire", "plan", "p1")

	time.Sleep(3 * time.Second) // well past --grace 1s
	assert.True(t, dead(grandchild),
		"a member of CMD's group is still running 3s after SIGTERM with --grace 1s, while owner \"other\" holds the lock\nstderr: %s", r.stderr)
}
