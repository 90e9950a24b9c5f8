//go:build linux

package proc_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/proc"
	"github.com/cleveragents/locks/domain"
)

func TestMachine_Gone(t *testing.T) {
	m, err := proc.ThisMachine()
	require.NoError(t, err)
	self, err := m.Owner(os.Getpid())
	require.NoError(t, err)
	parsed, ok := domain.ParseProcessOwner(self.String())
	require.True(t, ok, self.String())
	assert.False(t, m.Gone(parsed), "this process is alive")

	t.Run("Exited", func(t *testing.T) {
		cmd := exec.Command("true")
		require.NoError(t, cmd.Start())
		child, err := m.Owner(cmd.Process.Pid)
		require.NoError(t, err)
		require.NoError(t, cmd.Wait())
		assert.True(t, m.Gone(child), "an exited process is gone")
	})
	t.Run("Stopped", func(t *testing.T) {
		cmd := exec.Command("sleep", "60")
		require.NoError(t, cmd.Start())
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		child, err := m.Owner(cmd.Process.Pid)
		require.NoError(t, err)
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
		// The signal is delivered asynchronously: wait until the kernel
		// reports the stop, so that the probe reads a stopped process.
		var ws syscall.WaitStatus
		_, err = syscall.Wait4(cmd.Process.Pid, &ws, syscall.WUNTRACED, nil)
		require.NoError(t, err)
		require.True(t, ws.Stopped(), "wait status %#x", ws)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		require.NoError(t, err)
		require.Contains(t, string(b), ") T ", "the kernel shows the process stopped")
		assert.False(t, m.Gone(child), "a stopped process is alive")
	})
	t.Run("Zombie", func(t *testing.T) {
		cmd := exec.Command("true")
		require.NoError(t, cmd.Start())
		child, err := m.Owner(cmd.Process.Pid)
		require.NoError(t, err)
		defer func() { _ = cmd.Wait() }()
		// Not reaped until Wait: once it exits, it is a zombie.
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
			return err == nil && strings.Contains(string(b), ") Z ")
		}, 10*time.Second, time.Millisecond)
		assert.True(t, m.Gone(child), "an exited, unreaped process is gone")
	})
	t.Run("GroupOutlivesProcess", func(t *testing.T) {
		// The owner's process has exited, but a member of the group
		// that does its work runs on: the owner is not gone until the
		// group is empty.
		exited := exec.Command("true")
		require.NoError(t, exited.Start())
		owner, err := m.Owner(exited.Process.Pid)
		require.NoError(t, err)
		require.NoError(t, exited.Wait())
		member := exec.Command("sleep", "1000")
		member.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, member.Start())
		defer func() { _ = member.Process.Kill(); _ = member.Wait() }()
		owner.Group = member.Process.Pid
		assert.False(t, m.Gone(owner), "a member of the group is alive")
		require.NoError(t, member.Process.Kill())
		// Killed, but a zombie until reaped: still a member.
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", member.Process.Pid))
			return err == nil && strings.Contains(string(b), ") Z ")
		}, 10*time.Second, time.Millisecond)
		assert.False(t, m.Gone(owner), "an unreaped member still belongs to the group")
		_ = member.Wait()
		assert.True(t, m.Gone(owner), "the process and its group are gone")
	})
	t.Run("PIDReused", func(t *testing.T) {
		reused := self
		reused.StartTime++ // the pid is alive, but it is a later process
		assert.True(t, m.Gone(reused))
	})
	t.Run("NotThisMachine", func(t *testing.T) {
		for _, other := range []domain.ProcessOwner{
			func() domain.ProcessOwner { o := self; o.Host = "elsewhere"; o.PID = 1 << 30; return o }(),
			func() domain.ProcessOwner {
				o := self
				o.BootID = "00000000-0000-0000-0000-000000000000"
				o.PID = 1 << 30
				return o
			}(),
			func() domain.ProcessOwner { o := self; o.PIDNamespace++; o.PID = 1 << 30; return o }(),
		} {
			assert.False(t, m.Gone(other), "%s is not provably gone", other)
		}
	})
}
