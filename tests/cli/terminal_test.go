//go:build linux

package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openPTY opens a new pseudo-terminal and returns its two ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { master.Close() })
	ioctl := func(req uintptr, arg unsafe.Pointer) {
		_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), req, uintptr(arg))
		require.Zero(t, errno, "ioctl %#x", req)
	}
	var n uint32
	ioctl(syscall.TIOCGPTN, unsafe.Pointer(&n))
	var unlock int32
	ioctl(syscall.TIOCSPTLCK, unsafe.Pointer(&unlock))
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

// In a terminal, where agents is the foreground job, CMD runs in a
// process group of its own and yet has the terminal: it reads it (a
// background group would be stopped by SIGTTIN), gets Ctrl-C from it,
// and agents takes the terminal back when CMD ends.
func TestCLIRun_Terminal(t *testing.T) {
	a := newAgents(t)
	master, slave := openPTY(t)
	cmd := exec.Command(agentsBin, "--db", a.db, "locks", "run", "plan", "p1", "--", "sh", "-c",
		`read x; echo "got=$x"; trap 'echo interrupted; exit 7' INT; echo ready; while :; do sleep 0.05; done`)
	cmd.Env = slices.Clone(a.env)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session of its own, with the terminal as its controlling one: as a
	// shell starts a job in the foreground.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	var out bytes.Buffer
	outc := make(chan []byte)
	go func() {
		for {
			b := make([]byte, 1024)
			n, err := master.Read(b)
			if err != nil {
				close(outc)
				return
			}
			outc <- b[:n]
		}
	}()
	// await reads the terminal until it shows want.
	await := func(want string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for !strings.Contains(out.String(), want) {
			select {
			case b, ok := <-outc:
				require.True(t, ok, "the terminal closed; it showed %q", out.String())
				out.Write(b)
			case <-deadline:
				require.FailNow(t, "the terminal never showed "+want, "it showed %q", out.String())
			}
		}
	}

	_, err := master.Write([]byte("hello\n"))
	require.NoError(t, err)
	await("got=hello")
	await("ready")
	_, err = master.Write([]byte{0x03}) // Ctrl-C
	require.NoError(t, err)
	await("interrupted")
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		require.FailNow(t, "agents did not exit", "the terminal showed %q", out.String())
	}
	assert.Equal(t, 7, cmd.ProcessState.ExitCode(), "CMD's status; the terminal showed %q", out.String())
	assert.Equal(t, 1, strings.Count(out.String(), "interrupted"), "one Ctrl-C, one SIGINT")
}
