//go:build linux

package cli

import (
	"bytes"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Ctrl-C typed while "locks run" is starting up (the keeper started,
// the lock being taken, CMD being started) is never lost: the terminal
// stays agents' until CMD has joined its group, so the interrupt reaches
// agents, which either runs nothing or forwards it to CMD's group. It
// never ends as if it had not been typed (CMD run to completion, exit 0),
// nor as a failure to start CMD (exit 126), and the lock is released.
func TestCLIRun_CtrlCDuringStartupIsNeverLost(t *testing.T) {
	delays := []time.Duration{}
	for range 3 {
		for d := 0 * time.Millisecond; d <= 40*time.Millisecond; d += 2 * time.Millisecond {
			delays = append(delays, d)
		}
	}
	codes := map[int]int{}
	for _, d := range delays {
		a := newAgents(t)
		master, slave := openPTY(t)
		cmd := exec.Command(agentsBin, "--db", a.db, "locks", "run", "plan", "p1", "--ttl", "5s", "--",
			"sh", "-c", `echo STARTED; sleep 2; echo RAN-TO-COMPLETION`)
		cmd.Env = slices.Clone(a.env)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		require.NoError(t, cmd.Start())
		var mu sync.Mutex
		var out bytes.Buffer
		go func() {
			b := make([]byte, 4096)
			for {
				n, err := master.Read(b)
				mu.Lock()
				out.Write(b[:n])
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
		time.Sleep(d)
		_, _ = master.Write([]byte{3}) // Ctrl-C
		_ = cmd.Wait()
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		s := out.String()
		mu.Unlock()
		code := cmd.ProcessState.ExitCode()
		codes[code]++
		assert.False(t, bytes.Contains([]byte(s), []byte("RAN-TO-COMPLETION")),
			"Ctrl-C after %v reached nobody: CMD ran to completion (exit %d); terminal: %q", d, code, s)
		assert.NotContains(t, []int{0, 126}, code, "Ctrl-C after %v; terminal: %q", d, s)
		// Interrupted before the database was created, or while it was:
		// no lock either.
		if r := a.run("--json", "locks", "list"); r.code == 0 {
			assert.JSONEq(t, "[]", r.stdout, "Ctrl-C after %v left the lock held", d)
		} else {
			assert.Contains(t, r.stdout, `"no_database"`, "Ctrl-C after %v", d)
		}
		slave.Close()
		master.Close()
	}
	t.Logf("exit codes of %d Ctrl-Cs during startup: %v", len(delays), codes)
}
