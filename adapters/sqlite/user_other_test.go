//go:build !unix

package sqlite_test

import (
	"io/fs"
	"os/exec"
	"testing"
)

// runAs would make cmd run as another user: the tests that need one run
// as root on a Unix system only.
func runAs(t *testing.T, _ *exec.Cmd, _ uint32) {
	t.Helper()
	t.Skip("running a process as another user needs root on a Unix system")
}

// fileUID would return the file's owner, which only Unix systems give.
func fileUID(t *testing.T, _ fs.FileInfo) uint32 {
	t.Helper()
	t.Skip("a file's owning user is known on Unix systems only")
	return 0
}
