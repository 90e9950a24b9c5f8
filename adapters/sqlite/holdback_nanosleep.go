//go:build linux || freebsd || netbsd || openbsd || dragonfly

package sqlite

import (
	"errors"
	"syscall"
	"time"
)

// holdBack pauses the calling thread for d: a nanosleep wakes within
// microseconds, the runtime's timers a millisecond late.
func holdBack(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	for errors.Is(syscall.Nanosleep(&ts, &ts), syscall.EINTR) {
		// interrupted: ts now holds what is left to sleep
	}
}
