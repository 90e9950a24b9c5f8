package cli

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_TwoProcesses takes a lock as A with the shortest TTL, is refused
// as B while it lasts, and takes it as B once it has passed: real
// processes and the real clock, so the test waits about five seconds.
func TestCLI_TwoProcesses(t *testing.T) {
	t.Parallel()
	a := newAgents(t)

	var held lock
	a.mustRun("--json", "--owner", "A", "locks", "acquire", "plan", "p1", "--ttl", "5s").decode(t, &held)
	require.Equal(t, 5*time.Second, held.ExpiresAt.Sub(held.AcquiredAt))

	r := a.run("--json", "--owner", "B", "locks", "acquire", "plan", "p1")
	require.Equal(t, 3, r.code, "stderr: %s", r.stderr)
	assertConflict(t, r, "A")

	time.Sleep(time.Until(held.ExpiresAt) + 100*time.Millisecond)

	var taken lock
	a.mustRun("--json", "--owner", "B", "locks", "acquire", "plan", "p1").decode(t, &taken)
	assert.Equal(t, "B", taken.OwnerID)
	assert.Greater(t, taken.Token, held.Token, "a change of hands gets a larger fencing token")

	r = a.run("--owner", "A", "locks", "renew", "plan", "p1")
	assert.Equal(t, 3, r.code, "A's lock is gone, and B holds the resource")
}

// TestCLI_ConcurrentAcquireOneWinner starts several processes at once on a
// new database: they race to create and migrate it, then for the lock, and
// exactly one may win.
func TestCLI_ConcurrentAcquireOneWinner(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	const n = 4
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = a.run("--owner", fmt.Sprint("owner-", i), "locks", "acquire", "plan", "p1")
		})
	}
	wg.Wait()
	codes := map[int]int{}
	for _, r := range results {
		codes[r.code]++
	}
	assert.Equal(t, map[int]int{0: 1, 3: n - 1}, codes, "%+v", results)
}
