package postgres

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/cleveragents/locks/application"
)

// Server time. Every host that shares a PostgreSQL lock store decides
// expiry with the same clock: the server's. Reading it in every statement
// would cost a round trip on the hot path, so ServerClock keeps the
// difference between the server's clock and a local one (the offset),
// measured over a few round trips and refreshed in the background, and
// adds it to the local clock. Hosts whose own clocks disagree by minutes
// then agree on every expiry up to the offset's uncertainty: half the
// round trip of the best sample, plus how far the local clock drifts
// between two refreshes (a few microseconds a minute on an NTP-less host).
const (
	// ClockSamples is how many round trips one measurement makes; the
	// fastest one, whose midpoint is the most certain, is kept.
	ClockSamples = 5
	// ClockRefresh is how often the offset is measured again.
	ClockRefresh = time.Minute
)

// ServerClock is a local clock corrected to the PostgreSQL server's time.
// It satisfies application.Clock and application.Timers; its timers are
// the local clock's (a duration is the same on both).
type ServerClock struct {
	local  application.Clock
	timers application.Timers
	db     *sql.DB

	mu          sync.RWMutex
	offset      time.Duration
	uncertainty time.Duration
	lastErr     error

	stop chan struct{}
	done chan struct{}
}

var (
	_ application.Clock  = (*ServerClock)(nil)
	_ application.Timers = (*ServerClock)(nil)
)

// NewServerClock measures the offset of db's server from local, and keeps
// measuring it every ClockRefresh until Close.
//
// Errors: a *domain.StoreError when the server cannot be asked its time.
func NewServerClock(ctx context.Context, db *DB, local application.Clock) (*ServerClock, error) {
	c := &ServerClock{local: local, db: db.sql, stop: make(chan struct{}), done: make(chan struct{})}
	if t, ok := local.(application.Timers); ok {
		c.timers = t
	}
	if err := c.measure(ctx); err != nil {
		return nil, FormatError("read the server's clock", err)
	}
	go c.refresh()
	return c, nil
}

// Now returns the server's current time, estimated from the local clock.
func (c *ServerClock) Now() time.Time {
	c.mu.RLock()
	off := c.offset
	c.mu.RUnlock()
	return c.local.Now().Add(off)
}

// After waits on the local clock.
func (c *ServerClock) After(d time.Duration) <-chan time.Time {
	if c.timers != nil {
		return c.timers.After(d)
	}
	return time.After(d)
}

// Offset returns the server's time minus the local clock's, how uncertain
// that is (half the round trip it was measured over), and the error of the
// last refresh, if it failed (the previous offset is then still in use).
func (c *ServerClock) Offset() (offset, uncertainty time.Duration, err error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.offset, c.uncertainty, c.lastErr
}

// Close stops the refreshes.
func (c *ServerClock) Close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// refresh measures the offset again every ClockRefresh. It paces I/O on a
// real ticker: the offset is the same whatever the local clock shows.
func (c *ServerClock) refresh() {
	defer close(c.done)
	t := time.NewTicker(ClockRefresh)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.measure(ctx); err != nil {
			c.mu.Lock()
			c.lastErr = err
			c.mu.Unlock()
		}
		cancel()
	}
}

// measure asks the server its time ClockSamples times and keeps the
// sample with the shortest round trip: the server read its clock within
// that round trip, so at its midpoint up to half of it.
func (c *ServerClock) measure(ctx context.Context) error {
	conn, err := c.db.Conn(ctx) // one connection: the first sample pays for connecting
	if err != nil {
		return err
	}
	defer conn.Close()
	best := time.Duration(-1)
	var offset time.Duration
	for range ClockSamples + 1 {
		var server time.Time
		before := c.local.Now()
		if err := conn.QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&server); err != nil {
			return err
		}
		after := c.local.Now()
		rtt := after.Sub(before)
		if best < 0 || rtt < best {
			best = rtt
			offset = server.Sub(before.Add(rtt / 2))
		}
	}
	c.mu.Lock()
	c.offset, c.uncertainty, c.lastErr = offset, best/2, nil
	c.mu.Unlock()
	return nil
}
