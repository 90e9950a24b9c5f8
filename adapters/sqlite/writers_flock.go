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

// lockFile waits for the flock. Control keeps the descriptor open for the
// call: a close meanwhile must not free its number for another file to take.
func lockFile(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	if cerr := rc.Control(func(fd uintptr) {
		for err = syscall.Flock(int(fd), syscall.LOCK_EX); errors.Is(err, syscall.EINTR); {
			err = syscall.Flock(int(fd), syscall.LOCK_EX)
		}
	}); cerr != nil {
		return cerr
	}
	return err
}

func tryLockFile(f *os.File) bool {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

func unlockFile(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
