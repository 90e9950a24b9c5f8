package tests

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
)

// workerWait waits for plan1 on a clock that never moves, prints the lock
// it got, and exits (Close releases it).
func workerWait() int {
	ctx := context.Background()
	owner := os.Getenv(envOwner)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: owner, Clock: newMock()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer c.Close()
	h, err := c.Locks.Take(ctx, owner, plan1, application.AcquireOptions{Wait: true, TTL: time.Hour})
	if err != nil {
		fmt.Fprintln(os.Stderr, "take:", err)
		return 1
	}
	return reportJSON(h.Lock())
}
