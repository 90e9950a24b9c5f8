//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package sqlite

import (
	"errors"
	"os"
	"syscall"
)

const (
	haveFileLocks = true
	// sideFileFlags: follow no symbolic link, and wait for no FIFO's writer.
	sideFileFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK
)

func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func tryLockFile(f *os.File) bool {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

func unlockFile(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
