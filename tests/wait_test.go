package tests

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
)

// reportingClock is a mock clock that reports every timer set on it, so
// that the test moves time only once a waiter sleeps.
type reportingClock struct {
	*clock.Mock
	set chan time.Duration
}

func (c *reportingClock) After(d time.Duration) <-chan time.Time {
	ch := c.Mock.After(d)
	c.set <- d
	return ch
}

// A waiter in one container is not told of a release in another (another
// process, on the same file): it finds the lock free by polling, on the
// injected clock, and takes it at the first poll after the release.
func TestTake_WaitsAcrossContainersOnOneFile(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	clk := &reportingClock{Mock: newMock(), set: make(chan time.Duration, 64)}
	procA := MustOpen(t, locks.Config{Database: db, Owner: "A", Clock: clk})
	procB := MustOpen(t, locks.Config{Database: db, Owner: "B", Clock: clk})

	held, err := procA.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)
	type result struct {
		h   *application.Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := procB.Locks.Take(ctx, "B", plan1, application.AcquireOptions{Wait: true})
		done <- result{h, err}
	}()
	polls := 0
	var d time.Duration
	for range 3 { // B polls a few times, backing off, while A holds the lock
		d = <-clk.set
		polls++
		clk.Add(d)
	}
	_, err = held.Release(ctx)
	require.NoError(t, err)
	d = <-clk.set
	clk.Add(d)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, "B", r.h.Lock().Owner)
	assert.Greater(t, r.h.Lock().Token, held.Lock().Token)
	assert.LessOrEqual(t, d, 80*time.Millisecond, "after %d polls the backoff is still short", polls)
	_, err = r.h.Release(ctx)
	require.NoError(t, err)
}
