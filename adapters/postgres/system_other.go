//go:build !linux

package postgres

import "time"

// sinceBoot: no clock that counts the host's sleep is read here.
func sinceBoot() time.Duration { return time.Since(processStart) }
