package application_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// permanentFailures are renewal failures that no retry can resolve: the
// keep-alive ends the hold at the renewal that meets one, not at the
// expiry.
func permanentFailures() map[string]error {
	return map[string]error{
		"ReadOnly": &domain.StoreError{Op: "renew", Kind: domain.StoreReadOnly, Err: errors.New("attempt to write a readonly database")},
		"Schema":   &domain.StoreError{Op: "renew", Kind: domain.StoreSchema, Err: errors.New("no such table: locks")},
		// What the SQLite adapter reports for a database file renamed
		// while open: unreachable, which a retry may resolve elsewhere,
		// but marked permanent.
		"FileReplaced": &domain.StoreError{Op: "renew", Kind: domain.StoreUnreachable, Permanent: true,
			Err: errors.New("x.db names no file now")},
	}
}

// TestHandle_KeepAlive_PermanentFailureEndsTheHold: a renewal refused for
// good (the database file moved away, made read-only, its table dropped)
// ends the keep-alive's context at that renewal, with the true reason,
// rather than retrying it until the expiry while another process may hold
// the lock in the store that now goes by the database's name.
func TestHandle_KeepAlive_PermanentFailureEndsTheHold(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	ttl := 10 * time.Second
	for name, refusal := range permanentFailures() {
		t.Run(name, func(t *testing.T) {
			clk := testclock.New(holdStart)
			repo := &flakyRepo{LockRepository: memory.NewLockRepository()}
			svc := newHoldService(t, repo, clk)
			var endedAt time.Time
			err := svc.Do(ctx, "A", plan, application.AcquireOptions{TTL: ttl}, func(ctx context.Context, l domain.Lock) error {
				repo.failWith(func(context.Context) error { return refusal })
				require.Equal(t, ttl/2, clk.NextTimer(t))
				clk.Add(ttl / 2)
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second): // real time, generous: the clock no longer moves
					t.Fatal("the work's context did not end at the renewal the store refused for good")
				}
				endedAt = clk.Now()
				return ctx.Err()
			})
			assert.Equal(t, holdStart.Add(ttl/2), endedAt, "ended at the renewal, not at the expiry")
			var lost *domain.LockLostError
			require.ErrorAs(t, err, &lost)
			assert.Equal(t, domain.LostStoreFailing, lost.Reason)
			assert.Equal(t, holdStart.Add(ttl/2), lost.At)
			require.ErrorIs(t, err, domain.ErrUnavailable)
			require.ErrorIs(t, err, domain.ErrExpired)
			require.ErrorIs(t, err, refusal, "the store's own words")
			assert.Contains(t, lost.Error(), "no retry can succeed")
			assert.Contains(t, lost.Error(), refusal.Error())
		})
	}
}
