package application

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/domain"
)

// MinCleanupInterval is the shortest interval of a periodic cleanup:
// expired locks block nobody (Acquire replaces them), so purging them more
// often only adds writes.
const MinCleanupInterval = 5 * time.Second

// A purge's batches are sized by time, not count: on SQLite every other
// writer of the process waits for a whole batch. Each aims at cleanupTarget
// of writing, sized from the last one's rate within [cleanupMinBatch,
// cleanupMaxBatch]; a shorter target stopped helping a concurrent acquirer
// (docs/performance.md), and the floor keeps a purge moving on a slow store.
const (
	cleanupTarget     = time.Millisecond
	cleanupFirstBatch = 100
	cleanupMinBatch   = 20
	cleanupMaxBatch   = 20_000
	// cleanupCountAfter full batches, a purge counts the expired locks
	// left: a read that the short purges (most) do without.
	cleanupCountAfter = 4
)

// CleanupExpired purges every lock that has expired now and returns how
// many, in batches that each last about a millisecond of writing (see
// cleanupTarget), so that a writer queued behind one waits about that long,
// not for the whole backlog. It stops at a batch short of its limit, or
// early, with the count so far, if ctx is cancelled. After
// cleanupCountAfter full batches it asks the store how many expired locks
// are left, so that a store whose DeleteExpired keeps reporting full
// batches ends the purge with an error instead of looping for ever.
//
// Errors: *domain.StoreError, also for a store that reports removing more
// expired locks than it held; ctx.Err() when cancelled between batches;
// domain.ErrClosed after Close.
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
			// A lock written after the purge began expires after now
			// (clocks agreeing), so the store reported removing locks it
			// never held, and will go on reporting full batches.
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
		// The writers queued behind this batch go before the next one
		// (SQLite's writer queue is first come, first served).
		limit = nextCleanupBatch(limit, s.clock.Now().Sub(start))
	}
}

// nextCleanupBatch sizes the batch after one of limit rows that took took:
// the rows that fit in cleanupTarget at that rate, at most twice limit (a
// batch fast by luck must not make the next one long), within
// [cleanupMinBatch, cleanupMaxBatch].
func nextCleanupBatch(limit int, took time.Duration) int {
	next := 2 * limit
	if took > 0 {
		next = min(next, int(int64(limit)*int64(cleanupTarget)/int64(took)))
	}
	return max(cleanupMinBatch, min(cleanupMaxBatch, next))
}

// StaleCount returns how many locks have expired but are still stored: a
// non-zero count means cleanup has not run since they expired.
//
// Errors: *domain.StoreError; domain.ErrClosed after Close.
func (s *LockService) StaleCount(ctx context.Context) (int, error) {
	if err := s.gate.enter(); err != nil {
		return 0, err
	}
	defer s.gate.leave()
	return s.repo.CountExpired(ctx, s.Now())
}

// ValidateCleanupInterval checks an interval for StartCleanup: at least
// MinCleanupInterval (the container also accepts zero: no periodic
// cleanup).
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

// StartCleanup purges expired locks every interval on the service's clock,
// in a goroutine of its own, until Stop is called or the service closes;
// each run starts interval after the previous one ended. A failed run does
// not end the loop. onRun, when not nil, is called (in the loop's
// goroutine, so it must return promptly) after every run not cut short by
// Stop, with how many locks it purged and its error.
//
// Stop it before closing the service: Close waits for a run in progress,
// while Stop cuts it short.
//
// Errors: *domain.ValidationError for an interval shorter than
// MinCleanupInterval.
func (s *LockService) StartCleanup(interval time.Duration, onRun func(purged int, err error)) (*PeriodicCleanup, error) {
	if err := ValidateCleanupInterval(interval); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &PeriodicCleanup{cancel: cancel, done: make(chan struct{})}
	// Set before returning, so that the interval counts from now and a
	// mock clock moved just after the call fires it.
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
		case <-s.gate.done():
			return
		case <-tick:
		}
		n, err := s.CleanupExpired(ctx)
		if ctx.Err() != nil || errors.Is(err, domain.ErrClosed) {
			return
		}
		// Set before reporting, so that whoever waits for the report can
		// move a mock clock and fire it.
		tick = s.timers.After(interval)
		if onRun != nil {
			onRun(n, err)
		}
	}
}
