//go:build unix

package tests

import (
	"os/exec"
	"syscall"
	"testing"
)

// runAs makes cmd run as user and group uid, as only root may.
func runAs(t *testing.T, cmd *exec.Cmd, uid uint32) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
}
