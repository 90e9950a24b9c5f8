package application

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/domain"
)

// MinCleanupInterval is a periodic cleanup's shortest interval: expired
// locks block nobody (Acquire replaces them), so more often only adds writes.
const MinCleanupInterval = 5 * time.Second

// A purge's batches are sized by time, since on SQLite every writer waits
// for a whole batch; the floor keeps a slow store's purge moving.
const (
	cleanupTarget     = time.Millisecond
	cleanupFirstBatch = 100
	cleanupMinBatch   = 20
	cleanupMaxBatch   = 20_000
	// after so many full batches a purge counts the expired locks left
	cleanupCountAfter = 4
)

// CleanupExpired purges the locks expired now, in batches of about
// cleanupTarget each, and returns how many; past cleanupCountAfter full
// batches it counts what is left, so that a store always reporting full ones errs.
// Errors: *domain.StoreError; ctx.Err(); domain.ErrClosed after Close.
func (s *LockService) CleanupExpired(ctx context.Context) (int, error) {
	if err := s.gate.enter(); err != nil {
		return 0, err
	}
	defer s.gate.leave()
	n, err := s.cleanupExpired(ctx)
	if n > 0 {
		s.observe(ctx, Event{Kind: EventCleanedUp, Count: n})
	}
	return n, err
}

func (s *LockService) cleanupExpired(ctx context.Context) (int, error) {
	now := s.Now()
	total, limit := 0, cleanupFirstBatch
	held, left := -1, 0 // expired locks when the purge began, once counted
	for batch := 1; ; batch++ {
		start := s.clock.Now()
		n, err := s.repo.DeleteExpired(ctx, now, limit)
		total += n
		if err != nil || n < limit {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
		if held >= 0 && total > held {
			// Locks written since expire after now: these were never held.
			return total, &domain.StoreError{Op: "clean up expired locks", Advice: "the store breaks a promise of " +
				"application.LockRepository (check it with package locktest)", Err: fmt.Errorf(
				"DeleteExpired reported removing %d expired locks in this purge, more than the %d the store held "+
					"(%d reported removed by batch %d, and %d left then by CountExpired); it must return fewer than its limit "+
					"once no more have expired, so the purge stopped rather than loop for ever",
				total, held, held-left, cleanupCountAfter, left)}
		}
		if batch == cleanupCountAfter {
			if left, err = s.repo.CountExpired(ctx, now); err != nil {
				return total, err
			}
			held = total + left
		}
		limit = nextCleanupBatch(limit, s.clock.Now().Sub(start))
	}
}

// nextCleanupBatch sizes the next batch to fit cleanupTarget at the rate
// seen, at most doubling (a batch fast by luck must not make the next long).
func nextCleanupBatch(limit int, took time.Duration) int {
	next := 2 * limit
	if took > 0 {
		next = min(next, int(int64(limit)*int64(cleanupTarget)/int64(took)))
	}
	return max(cleanupMinBatch, min(cleanupMaxBatch, next))
}

// StaleCount returns how many locks have expired but are still stored.
// Errors: *domain.StoreError; domain.ErrClosed after Close.
func (s *LockService) StaleCount(ctx context.Context) (int, error) {
	if err := s.gate.enter(); err != nil {
		return 0, err
	}
	defer s.gate.leave()
	return s.repo.CountExpired(ctx, s.Now())
}

// ValidateCleanupInterval checks that interval is at least MinCleanupInterval.
func ValidateCleanupInterval(interval time.Duration) error {
	if interval < MinCleanupInterval {
		return &domain.ValidationError{Field: "cleanup_interval", Reason: fmt.Sprintf(
			"%v is shorter than the minimum %v; pass at least %v, or zero for no periodic cleanup",
			interval, MinCleanupInterval, MinCleanupInterval)}
	}
	return nil
}

// PeriodicCleanup is a loop of StartCleanup's.
type PeriodicCleanup struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartCleanup runs CleanupExpired every interval after the last run ended,
// on the service's clock, until Stop or Close; onRun, if not nil, gets each
// run's count and error on that goroutine and must return promptly.
// Errors: *domain.ValidationError for an interval below MinCleanupInterval.
func (s *LockService) StartCleanup(interval time.Duration, onRun func(purged int, err error)) (*PeriodicCleanup, error) {
	if err := ValidateCleanupInterval(interval); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &PeriodicCleanup{cancel: cancel, done: make(chan struct{})}
	// Set now: a mock clock moved just after the call fires it.
	tick := s.timers.After(interval)
	go p.run(ctx, s, interval, tick, onRun)
	return p, nil
}

// Stop ends the loop, cutting short a run, and waits for it; again: no-op.
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
		case <-s.gate.closing:
			return
		case <-tick:
		}
		n, err := s.CleanupExpired(ctx)
		if ctx.Err() != nil || errors.Is(err, domain.ErrClosed) {
			return
		}
		// Set before reporting, so that its reader can move a mock clock.
		tick = s.timers.After(interval)
		if onRun != nil {
			onRun(n, err)
		}
	}
}
