package application_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/locktest/testclock"
)

// A lock can reach its holder with less than TTL/2 left: its acquisition
// was dated when the statement began and the answer came late (tests/hosts
// found one that arrived 1.35 s before its expiry, after a blackholed
// link came back). The keep-alive must still renew it before it expires,
// or end its context at the expiry; it waited TTL/2 from its start, and
// the holder heard of the loss 1.1 s after the expiry.
func TestHandle_KeepAliveOfALateLock(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := testclock.New(holdStart)
	repo := &attemptRepo{LockRepository: memory.NewLockRepository(), clk: clk, attempts: make(chan time.Time, 1024)}
	svc := newHoldService(t, repo, clk)
	const ttl = 10 * time.Second
	h, err := svc.Take(context.Background(), "A", plan, application.AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	<-repo.attempts // the Take's own write
	clk.Add(8 * time.Second)
	expiry := h.Lock().ExpiresAt
	held := h.KeepAlive(context.Background())
	defer func() { _, _ = h.Release(context.Background()) }()

	d := clk.NextTimer(t)
	left := expiry.Sub(clk.Now())
	require.Less(t, d, left, "with %v left, the keep-alive waits %v before its first renewal", left, d)
	clk.Add(d)
	select {
	case at := <-repo.attempts:
		require.Less(t, at, expiry, "the first renewal comes before the expiry")
	case <-h.Done():
		t.Fatalf("the keep-alive ended instead of renewing: %v", h.Err())
	case <-time.After(eventBound):
		t.Fatalf("no renewal within %v of its timer", eventBound)
	}
	require.NoError(t, held.Err())
}
