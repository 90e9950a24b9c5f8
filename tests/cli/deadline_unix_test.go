//go:build unix

package cli

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// busyWaits is how many times a command may wait for another process's
// write lock of a SQLite file. SQLite waits in C, out of the context's
// reach, for at most the busy timeout (which the deadline shortens), and
// renew waits so up to four times (the writers' queue, the statement,
// closing): not yet the deadline itself, but a bound that it sets.
const busyWaits = 4

// TestCLI_DeadlineWriteLockHeld: behind another process that holds the
// write lock of the SQLite file for good, every command that writes gives
// up, saying the file stayed busy; the readers do not wait.
func TestCLI_DeadlineWriteLockHeld(t *testing.T) {
	t.Parallel()
	const deadline = 2 * time.Second
	a := newAgents(t)
	a.mustRun("--owner", "op", "locks", "acquire", "plan", "p1")
	startHolder(t, a.db)
	for name, args := range everyCommand {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			r := a.runEnv([]string{"AGENTS_TIMEOUT=2s"}, append([]string{"--db", a.db}, args...)...)
			// The margin is for starting agents on a loaded machine; without the
			// deadline these commands took 20 s and more.
			assert.Less(t, time.Since(start), busyWaits*deadline+8*time.Second, "the deadline is %s", deadline)
			switch name {
			case "list", "list-all", "diagnostics":
				assert.Equal(t, 0, r.code, "readers never wait: %s", r.stderr)
			default:
				assert.Equal(t, 1, r.code, r.stderr)
				assert.Contains(t, r.stderr, "no answer within 2s")
				assert.Contains(t, r.stderr, "the file stayed busy")
			}
		})
	}
}
