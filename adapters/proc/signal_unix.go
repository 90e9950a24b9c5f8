//go:build unix

package proc

import (
	"errors"
	"syscall"
)

// noSuchProcess reports whether kill(id, 0) (id a pid, or -pgid) answers
// ESRCH; EPERM means one exists that this process may not signal.
func noSuchProcess(id int) bool { return errors.Is(syscall.Kill(id, 0), syscall.ESRCH) }
