package tests

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// utcClock is an application's clock as many are written: the real time,
// in UTC. time.Time.UTC strips the monotonic reading, so this clock's
// readings carry wall time only. step stands for NTP or `date -s`
// stepping the host's wall clock.
type utcClock struct{ step atomic.Int64 }

func (c *utcClock) Now() time.Time {
	return time.Now().UTC().Add(time.Duration(c.step.Load()))
}

// Config.Clock promises that on PostgreSQL "a step of the
// wall clock moves nothing". With an injected real-time clock whose
// readings are UTC (no monotonic reading, and no Monotonic method), the
// server-time estimate must not move with the host's wall clock: after a +11 min
// step this host must still be refused another host's live 5-minute lock.
func TestServerTime_WallStepWithUTCClockKeepsLiveLock(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	a, err := locks.Open(ctx, locks.Config{Database: dsn, Owner: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	clk := &utcClock{}
	b, err := locks.Open(ctx, locks.Config{Database: dsn, Owner: "host-b", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "clock"}
	held, err := a.Locks.Acquire(ctx, "host-a", ref, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	clk.step.Store(int64(11 * time.Minute)) // host B's wall clock steps forward
	l, err := b.Locks.Acquire(ctx, "host-b", ref, 5*time.Minute)
	if err == nil {
		t.Fatalf("host B took host A's live lock (token %d, expires %v, server now ~%v) after a wall step of +11m: "+
			"got token %d; B's clock reads %v", held.Token, held.ExpiresAt, a.Locks.Now(), l.Token, b.Locks.Now())
	}
	t.Logf("refused as it should be: %v", err)
}
