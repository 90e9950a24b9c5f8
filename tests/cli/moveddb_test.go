//go:build unix

package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLIRun_DatabaseMovedEndsTheRun: the database renamed (mv) under a
// running "locks run". A process that opens the new name sees no lock (the
// holder's row may be in the old name's journal), so the holder must stop
// its command as soon as it can know: its next renewal, which the store
// refuses for good, not the lock's expiry, which no renewal can reach.
func TestCLIRun_DatabaseMovedEndsTheRun(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	ready, term := filepath.Join(a.dir, "ready"), filepath.Join(a.dir, "term")
	p := a.start("--json", "--owner", "A", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "1s",
		"--", "sh", "-c", stopsOnTerm, ready, term)
	pid := p.awaitPID(ready)
	require.NoError(t, os.Rename(a.db, filepath.Join(a.dir, "moved.db")))

	r := p.wait()
	assert.Equal(t, 4, r.code, "the loss's exit code\nstderr: %s", r.stderr)
	assert.FileExists(t, term, "the command got SIGTERM")
	assert.Eventually(t, func() bool { return dead(pid) }, 5*time.Second, 10*time.Millisecond, "the command is stopped")
	var doc runDoc
	r.decode(t, &doc)
	require.NotNil(t, doc.Lost, "stderr: %s", r.stderr)
	assert.Equal(t, "store_failing", doc.Lost.Reason)
	assert.Contains(t, doc.Lost.Message, "removed, renamed or replaced while it was open")
	assert.Contains(t, doc.Lost.Message, "no retry can succeed")
	// Ordering, not speed: the loss was noticed before the expiry that the
	// last renewal had set.
	m := regexp.MustCompile(`expir(?:ed|y) at (\S+?Z)`).FindStringSubmatch(doc.Lost.Message)
	require.NotNil(t, m, doc.Lost.Message)
	expiry, err := time.Parse(time.RFC3339Nano, m[1])
	require.NoError(t, err)
	at, err := time.Parse(time.RFC3339Nano, doc.Lost.At)
	require.NoError(t, err)
	assert.True(t, at.Before(expiry), "the loss was noticed at %s, not before the lock's expiry at %s", at, expiry)
}
