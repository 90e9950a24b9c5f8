package domain

import (
	"fmt"
	"time"
)

// The TTL policy. A lock lives for its TTL unless renewed or released.
const (
	// DefaultLockTTL is used when a caller passes a zero TTL.
	DefaultLockTTL = 300 * time.Second
	// MinLockTTL is the shortest TTL accepted.
	MinLockTTL = 5 * time.Second
	// MaxLockTTL is the longest TTL accepted. Longer work renews instead.
	MaxLockTTL = 3600 * time.Second
)

// ResolveTTL returns the TTL to apply for a requested one: zero means
// DefaultLockTTL, anything else must lie within [MinLockTTL, MaxLockTTL].
// Out-of-range values are rejected with a *ValidationError, never clamped,
// so that a caller's mistake is seen rather than silently changed.
func ResolveTTL(ttl time.Duration) (time.Duration, error) {
	if ttl == 0 {
		return DefaultLockTTL, nil
	}
	if err := ValidateTTL(ttl); err != nil {
		return 0, err
	}
	return ttl, nil
}

// ValidateTTL checks that ttl lies within [MinLockTTL, MaxLockTTL].
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinLockTTL || ttl > MaxLockTTL {
		return &ValidationError{
			Field:  "ttl",
			Reason: fmt.Sprintf("%v is outside the allowed range %v to %v; pass a TTL within it, or zero for the default %v", ttl, MinLockTTL, MaxLockTTL, DefaultLockTTL),
		}
	}
	return nil
}

// RenewInterval is how often a holder should renew a lock taken with ttl:
// half the TTL, which leaves a whole half of it to absorb a slow renewal.
func RenewInterval(ttl time.Duration) time.Duration { return ttl / 2 }
