//go:build linux || freebsd || netbsd || openbsd || dragonfly

package sqlite

import (
	"errors"
	"syscall"
	"time"
)

// holdBack pauses the calling thread for d. The Go runtime's timers can
// wake a short sleep a millisecond late; a nanosleep wakes within
// microseconds, and the runtime runs other goroutines meanwhile, as it
// does during any system call.
func holdBack(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	for {
		var left syscall.Timespec
		err := syscall.Nanosleep(&ts, &left)
		if !errors.Is(err, syscall.EINTR) {
			return
		}
		ts = left
	}
}
