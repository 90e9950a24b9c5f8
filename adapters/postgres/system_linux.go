package postgres

import (
	"time"

	"golang.org/x/sys/unix"
)

// sinceBoot reads CLOCK_BOOTTIME, which kernels before 2.6.39 lack.
func sinceBoot() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Since(processStart)
	}
	return time.Duration(ts.Nano())
}
