//go:build linux

package proc_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/proc"
	"github.com/cleveragents/locks/domain"
)

// envProbe makes the test binary a prober (TestHelperHiddenProbe): in a
// mount namespace of its own, with /proc mounted hidepid=2 and running as
// an unprivileged user, it prints whether the owner id it names is gone.
const envProbe = "PROC_TEST_HIDDEN_PROBE"

// The uids of the holder and of the prober: two users, neither root, so
// that hidepid=2 hides the holder's /proc entry from the prober.
const holderUID, proberUID = 65534, 65533

// TestHelperHiddenProbe is not a test: it is the prober that
// TestMachine_GoneUnderHidepid runs, and does nothing without envProbe.
func TestHelperHiddenProbe(t *testing.T) {
	owner := os.Getenv(envProbe)
	if owner == "" {
		return
	}
	gone, err := hiddenProbe(owner)
	if errors.Is(err, syscall.EPERM) {
		fmt.Printf("cannot mount: %v\n", err)
		os.Exit(3)
	}
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(2)
	}
	fmt.Printf("gone=%t\n", gone)
	os.Exit(0)
}

func hiddenProbe(owner string) (bool, error) {
	// Private, so that the new /proc is this namespace's only.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return false, fmt.Errorf("make / private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", 0, "hidepid=2"); err != nil {
		return false, fmt.Errorf("mount /proc hidepid=2: %w", err)
	}
	if err := syscall.Setgid(proberUID); err != nil {
		return false, err
	}
	if err := syscall.Setuid(proberUID); err != nil {
		return false, err
	}
	p, ok := domain.ParseProcessOwner(owner)
	if !ok {
		return false, fmt.Errorf("not a process owner: %q", owner)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", p.PID)); !os.IsNotExist(err) {
		return false, fmt.Errorf("/proc/%d is not hidden from the prober: %v", p.PID, err)
	}
	m, err := proc.ThisMachine()
	if err != nil {
		return false, err
	}
	return m.Gone(p), nil
}

// probeHidden runs the prober on owner and returns what it printed.
func probeHidden(t *testing.T, owner domain.ProcessOwner) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHiddenProbe$", "-test.count=1")
	cmd.Env = append(os.Environ(), envProbe+"="+owner.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if errors.Is(err, syscall.EPERM) || cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 3 {
		t.Skipf("this root may not mount /proc (no CAP_SYS_ADMIN): %s", out)
	}
	require.NoError(t, err, "%s", out)
	return strings.TrimSpace(string(out))
}

// Under /proc mounted hidepid=2 (the hardened default of many servers), a
// process of another user has no /proc entry for the prober: it is alive
// all the same (kill(pid, 0) says EPERM, not ESRCH), and must not read as
// gone. A process that has exited is still proven gone.
func TestMachine_GoneUnderHidepid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a private /proc and runs processes as other users")
	}
	m, err := proc.ThisMachine()
	require.NoError(t, err)

	holder := exec.Command("sleep", "1000")
	holder.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: holderUID, Gid: holderUID},
		Setpgid: true}
	require.NoError(t, holder.Start())
	defer func() { _ = holder.Process.Kill(); _ = holder.Wait() }()
	alive, err := m.Owner(holder.Process.Pid)
	require.NoError(t, err)
	assert.Equal(t, "gone=false", probeHidden(t, alive), "a live holder hidden by hidepid is alive")

	exited := exec.Command("true")
	require.NoError(t, exited.Start())
	gone, err := m.Owner(exited.Process.Pid)
	require.NoError(t, err)
	require.NoError(t, exited.Wait())
	assert.Equal(t, "gone=true", probeHidden(t, gone), "an exited holder is gone, hidden or not")

	// The holder's process has exited, but its work goes on in a group
	// whose member the prober can neither see nor signal.
	gone.Group = holder.Process.Pid
	assert.Equal(t, "gone=false", probeHidden(t, gone), "a hidden member of the holder's group is alive")
}
