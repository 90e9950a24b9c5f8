//go:build unix

package sqlite_test

import (
	"io/fs"
	"os/exec"
	"syscall"
	"testing"
)

// runAs makes cmd run as user and group uid, as only root may.
func runAs(t *testing.T, cmd *exec.Cmd, uid uint32) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
}

// fileUID returns the user that owns the file fi describes.
func fileUID(t *testing.T, fi fs.FileInfo) uint32 {
	t.Helper()
	return fi.Sys().(*syscall.Stat_t).Uid
}
