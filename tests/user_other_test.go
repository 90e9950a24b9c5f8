//go:build !unix

package tests

import (
	"os/exec"
	"testing"
)

// runAs would make cmd run as another user: the tests that need one run
// as root on a Unix system only.
func runAs(t *testing.T, _ *exec.Cmd, _ uint32) {
	t.Helper()
	t.Skip("running a process as another user needs root on a Unix system")
}
