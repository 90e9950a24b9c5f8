package postgres

import "time"

// SystemClock is this host's clock, for a ServerClock in production: wall
// time from time.Now, timers from time.After, and a monotonic reading that
// counts the time the host slept (CLOCK_BOOTTIME on Linux). Go's own
// monotonic clock stops while the host is suspended, so that a host
// resumed from sleep would estimate the server's time behind by how long
// it slept, until the next measurement, and write expiries that early.
// Neither reading moves when the wall clock is stepped.
type SystemClock struct{}

var _ MonotonicClock = SystemClock{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// After waits on real time.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Monotonic returns the time since the host booted, sleep included, where
// the system has such a clock, and otherwise Go's monotonic time since
// the process started.
func (SystemClock) Monotonic() time.Duration { return sinceBoot() }

// processStart anchors the fallback monotonic reading.
var processStart = time.Now()
