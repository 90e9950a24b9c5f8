//go:build !(linux || freebsd || netbsd || openbsd || dragonfly)

package sqlite

import "time"

// holdBack pauses for about d, through the runtime's timers (no nanosleep,
// as on macOS).
func holdBack(d time.Duration) { time.Sleep(d) }
