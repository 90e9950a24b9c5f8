//go:build unix

package cli

import (
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_ReentryNeverShortensARun: "locks acquire" by the owner of a
// running "locks run" re-enters its lock, with a shorter --ttl too, and
// extends, never shortens it: the run's lock does not expire behind its
// keep-alive's back (which renews at ttl/2 of its own, longer TTL), and
// another owner is refused meanwhile. The message shows the expiry the
// lock has.
func TestCLI_ReentryNeverShortensARun(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	ready := filepath.Join(a.dir, "ready")
	p := a.start("--owner", "A", "locks", "run", "plan", "p1", "--ttl", "60s", "--", "sh", "-c", `echo $$ > "$0"; exec sleep 60`, ready)
	p.awaitPID(ready)
	var before []lock
	a.mustRun("--json", "locks", "list").decode(t, &before)
	require.Len(t, before, 1)

	var doc struct {
		lock
		Reentered bool `json:"reentered"`
	}
	a.mustRun("--json", "--owner", "A", "locks", "acquire", "plan", "p1", "--ttl", "5s").decode(t, &doc)
	assert.True(t, doc.Reentered)
	assert.Equal(t, before[0].Token, doc.Token)
	assert.False(t, doc.ExpiresAt.Before(before[0].ExpiresAt), "re-entered with --ttl 5s: expires %s, earlier than the run's %s",
		doc.ExpiresAt, before[0].ExpiresAt)

	r := a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1", "--ttl", "5s")
	assert.Contains(t, r.stdout, "Re-entered plan/p1")
	m := regexp.MustCompile(`expires .*\(in (\S+)\)`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	left, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	assert.Greater(t, left, 5*time.Second, "the message shows the run's later expiry, not now+5s\n%s", r.stdout)

	var after []lock
	a.mustRun("--json", "locks", "list").decode(t, &after)
	require.Len(t, after, 1)
	assert.False(t, after[0].ExpiresAt.Before(before[0].ExpiresAt), "the stored expiry was shortened")
	b := a.run("--owner", "B", "locks", "acquire", "plan", "p1")
	assert.Equal(t, 3, b.code, "another owner is refused while the run holds the lock\nstderr: %s", b.stderr)
	p.signal(syscall.SIGTERM)
	p.wait()
}
