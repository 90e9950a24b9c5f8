//go:build unix

package proc

import (
	"errors"
	"syscall"
)

// noSuchProcess reports whether the kernel says that no process has id
// (a pid, or -pgid for a process group): kill(id, 0), which sends nothing,
// answers ESRCH. EPERM means that one exists that this process may not
// signal.
func noSuchProcess(id int) bool {
	return errors.Is(syscall.Kill(id, 0), syscall.ESRCH)
}
