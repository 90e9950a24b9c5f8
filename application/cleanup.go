package application

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/domain"
)

// MinCleanupInterval is the shortest interval of a periodic cleanup.
// Expired locks block nobody (Acquire replaces them); they only take room
// in the store, so purging them more often than this only adds writes.
const MinCleanupInterval = 5 * time.Second

// ValidateCleanupInterval checks an interval for StartCleanup: at least
// MinCleanupInterval. (The container also accepts zero, which means no
// periodic cleanup.)
func ValidateCleanupInterval(interval time.Duration) error {
	if interval < MinCleanupInterval {
		return &domain.ValidationError{Field: "cleanup_interval", Reason: fmt.Sprintf(
			"%v is shorter than the minimum %v; pass at least %v, or zero for no periodic cleanup",
			interval, MinCleanupInterval, MinCleanupInterval)}
	}
	return nil
}

// PeriodicCleanup runs a service's CleanupExpired every interval, on the
// service's clock, until it is stopped. StartCleanup starts one.
type PeriodicCleanup struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartCleanup purges expired locks every interval on the service's clock
// (so that a mock clock drives it in tests), in a goroutine of its own,
// until Stop is called or the service closes. Each run starts interval
// after the previous one ended.
//
// A run that fails (a busy or unreachable store) does not end the loop: the
// next run comes an interval later. onRun, when not nil, is called after
// every run that was not cut short by Stop, with how many locks it purged
// and its error (nil on success): that is how a caller sees the failures,
// in the loop's goroutine, which waits for it; it must return promptly.
//
// Stop it before closing the service: Close waits for a run in progress,
// while Stop cuts it short. A loop whose service closes ends at once.
//
// Errors: *domain.ValidationError for an interval shorter than
// MinCleanupInterval.
func (s *LockService) StartCleanup(interval time.Duration, onRun func(purged int, err error)) (*PeriodicCleanup, error) {
	if err := ValidateCleanupInterval(interval); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &PeriodicCleanup{cancel: cancel, done: make(chan struct{})}
	// The first timer is set before StartCleanup returns, so that the
	// interval counts from now: a mock clock moved just after the call
	// fires it.
	tick := s.timers.After(interval)
	go p.run(ctx, s, interval, tick, onRun)
	return p, nil
}

// Stop ends the loop, cutting short a run in progress, and returns once
// its goroutine has ended. Calling it again does nothing.
func (p *PeriodicCleanup) Stop() {
	p.cancel()
	<-p.done
}

func (p *PeriodicCleanup) run(ctx context.Context, s *LockService, interval time.Duration,
	tick <-chan time.Time, onRun func(int, error)) {
	defer close(p.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.gate.done(): // the service closed: nothing left to clean
			return
		case <-tick:
		}
		n, err := s.CleanupExpired(ctx)
		if ctx.Err() != nil || errors.Is(err, domain.ErrClosed) {
			return
		}
		// Set the next timer before reporting, so that whoever waits for
		// the report can move a mock clock and fire it.
		tick = s.timers.After(interval)
		if onRun != nil {
			onRun(n, err)
		}
	}
}
