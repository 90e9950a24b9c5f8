//go:build !(linux || freebsd || netbsd || openbsd || dragonfly)

package sqlite

import "time"

// holdBack pauses for about d: where there is no nanosleep to call
// (macOS), through the runtime's timers, which may wake later.
func holdBack(d time.Duration) { time.Sleep(d) }
