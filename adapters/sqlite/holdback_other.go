//go:build !(linux || freebsd || netbsd || openbsd || dragonfly)

package sqlite

import "time"

// holdBack pauses for about d where there is no nanosleep (macOS).
func holdBack(d time.Duration) { time.Sleep(d) }
