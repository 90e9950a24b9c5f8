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

	"github.com/stretchr/testify/require"
)

// Review 2: a Ctrl-C typed while "locks run" is starting up (after the
// keeper has taken the terminal, before CMD has joined its group) reaches
// no one: the keeper ignores it, CMD has not started yet, and agents does
// not see it either. CMD then runs to completion and agents exits 0, as if
// Ctrl-C had never been pressed.
func TestCLIRun_Review2_CtrlCDuringStartupIsSwallowed(t *testing.T) {
	delays := []time.Duration{}
	for range 4 {
		for d := 10 * time.Millisecond; d <= 30*time.Millisecond; d += 2 * time.Millisecond {
			delays = append(delays, d)
		}
	}
	swallowed := 0
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
		if cmd.ProcessState.ExitCode() == 0 && bytes.Contains([]byte(s), []byte("RAN-TO-COMPLETION")) {
			swallowed++
			t.Logf("Ctrl-C after %v: swallowed; exit 0; terminal: %q", d, s)
		}
		slave.Close()
		master.Close()
	}
	require.Zero(t, swallowed, "of %d Ctrl-Cs during startup, %d reached nobody: CMD ran to completion and agents exited 0", len(delays), swallowed)
}
