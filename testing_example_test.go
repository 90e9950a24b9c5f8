package locks_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// runPlanUnderLock is the embedder's code under test: it waits for the
// plan's lock, keeps it while the plan runs, and reports the token.
func runPlanUnderLock(ctx context.Context, c *locks.Container, plan domain.ResourceRef) (token int64, err error) {
	err = c.Locks.Do(ctx, c.Owner(), plan, application.AcquireOptions{Wait: true, Timeout: time.Minute},
		func(ctx context.Context, l domain.Lock) error { token = l.Token; return ctx.Err() })
	return token, err
}

// A test of code that waits for a lock moves a test clock past the
// holder's expiry instead of sleeping. Waiting counts a waiter once its
// timers are set, so the move always reaches it (docs/testing.md).
func Example_testClock() {
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	c, _ := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase, Owner: "me", Clock: clk})
	defer c.Close()
	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-7"}
	_, _ = c.Locks.Acquire(ctx, "other", plan, 30*time.Second) // another owner holds it

	type result struct {
		token int64
		err   error
	}
	done := make(chan result, 1)
	go func() { tok, err := runPlanUnderLock(ctx, c, plan); done <- result{tok, err} }()
	for c.Locks.Waiting(plan) == 0 {
		runtime.Gosched() // until the waiter is parked on the clock
	}
	clk.Add(31 * time.Second) // past the holder's expiry
	r := <-done
	fmt.Println("ran under token", r.token, "error:", r.err)
	// Output: ran under token 2 error: <nil>
}

// In a testing/synctest bubble, on the real clock, time.Sleep moves time
// for every goroutine of the bubble at once: the wait, the keep-alive and
// the expiry follow. An Example cannot hold the *testing.T that
// synctest.Test needs, so this one is a test (docs/testing.md).
func TestExample_Synctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		c, err := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase, Owner: "me"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-7"}
		_, _ = c.Locks.Acquire(ctx, "other", plan, 30*time.Second)
		start := time.Now()
		if _, err := runPlanUnderLock(ctx, c, plan); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start).Round(time.Second); waited != 30*time.Second {
			t.Fatalf("waited %s for a lock that expired in 30s", waited)
		}
	})
}
