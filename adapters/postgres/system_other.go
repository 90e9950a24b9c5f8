//go:build !linux

package postgres

import "time"

// sinceBoot is Go's monotonic time since the process started, where the
// module reads no clock that counts the host's sleep.
func sinceBoot() time.Duration { return time.Since(processStart) }
