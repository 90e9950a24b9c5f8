//go:build linux || freebsd || netbsd || openbsd || dragonfly

package sqlite

import (
	"errors"
	"syscall"
	"time"
)

// holdBack pauses the calling thread for d: a nanosleep wakes within
// microseconds, where the runtime's timers can wake a short sleep a
// millisecond late. Other goroutines run meanwhile, as in any system call.
func holdBack(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	for {
		var left syscall.Timespec
		if err := syscall.Nanosleep(&ts, &left); !errors.Is(err, syscall.EINTR) {
			return
		}
		ts = left
	}
}
