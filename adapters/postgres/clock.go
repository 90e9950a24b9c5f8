package postgres

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/application"
)

// Every host decides expiry on the server's clock. ServerClock keeps the
// server's time at one instant of the local monotonic clock, measured
// over a few round trips, and adds the monotonic time elapsed since: a
// step of the wall clock moves nothing, and hosts agree up to half the
// best round trip plus the monotonic drift between two measurements.
const (
	// ClockSamples is how many round trips one measurement makes; the
	// fastest, whose midpoint is the most certain, is kept.
	ClockSamples = 5
	// ClockRefresh is how often the server's time is measured again.
	ClockRefresh = time.Minute
)

// MonotonicClock is a local clock with a reading that a step of the wall
// clock does not move, which ServerClock measures elapsed time on. Of
// another clock only the wall time is used (Offset), and elapsed time is
// SystemClock's, so that time.Now().UTC() (no monotonic reading) cannot
// let a wall step move the estimate; but elapsed time is a *clock.Mock's
// own, so that stepping a test's clock steps the server's estimate.
type MonotonicClock interface {
	application.Clock
	// Monotonic returns the time elapsed since a fixed instant of the
	// clock's choosing; it never decreases.
	Monotonic() time.Duration
}

// ServerClock is the PostgreSQL server's time, estimated on this host.
// It satisfies application.Clock and application.Timers; its timers are
// the local clock's (a duration is the same on both).
type ServerClock struct {
	local  application.Clock
	mono   func() time.Duration // nil for a *clock.Mock, whose Now is the test's time
	timers application.Timers
	db     *sql.DB

	mu          sync.RWMutex
	at, mark    time.Time // the server's time at the instant mark (tick)
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

// NewServerClock measures the time of db's server against local, and keeps
// measuring it every ClockRefresh until Close.
//
// Errors: a *domain.StoreError when the server cannot be asked its time.
func NewServerClock(ctx context.Context, db *DB, local application.Clock) (*ServerClock, error) {
	c := &ServerClock{local: local, db: db.sql, stop: make(chan struct{}), done: make(chan struct{})}
	if t, ok := local.(application.Timers); ok {
		c.timers = t
	}
	switch l := local.(type) {
	case MonotonicClock:
		c.mono = l.Monotonic
	case *clock.Mock:
	default:
		c.mono = SystemClock{}.Monotonic
	}
	if err := read(ctx, c.measure); err != nil {
		return nil, FormatError("read the server's clock", err)
	}
	go c.refresh()
	return c, nil
}

// Now returns the server's current time: its time at the last
// measurement plus the local monotonic time elapsed since.
func (c *ServerClock) Now() time.Time {
	c.mu.RLock()
	at, mark := c.at, c.mark
	c.mu.RUnlock()
	return at.Add(c.tick().Sub(mark))
}

// monotonicEpoch has no monotonic component, so Sub of two ticks is the
// difference of the readings.
var monotonicEpoch = time.Unix(0, 0)

// tick reads the monotonic clock as a time.Time: mono's reading, or a
// *clock.Mock's Now.
func (c *ServerClock) tick() time.Time {
	if c.mono != nil {
		return monotonicEpoch.Add(c.mono())
	}
	return c.local.Now()
}

// After waits on the local clock.
func (c *ServerClock) After(d time.Duration) <-chan time.Time {
	if c.timers != nil {
		return c.timers.After(d)
	}
	return time.After(d)
}

// Offset returns what the local wall clock was off by at the last
// measurement (decisions do not use it), the estimate's uncertainty (half
// the round trip), and the last refresh's error (the previous measurement
// then stays in use).
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

// refresh measures again every ClockRefresh, correcting the monotonic
// drift, on a real ticker: it paces I/O.
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
		if err := read(ctx, c.measure); err != nil {
			c.mu.Lock()
			c.lastErr = err
			c.mu.Unlock()
		}
		cancel()
	}
}

// measure asks the server its time ClockSamples times and keeps the
// sample with the shortest round trip, placing the server's reading at
// its midpoint; the wall clock is read only for Offset.
func (c *ServerClock) measure(ctx context.Context) error {
	conn, err := c.db.Conn(ctx) // one connection: the first sample pays for connecting
	if err != nil {
		return err
	}
	defer conn.Close()
	best := time.Duration(-1)
	var at, mark time.Time
	var offset time.Duration
	for range ClockSamples + 1 {
		var server time.Time
		wall, before := c.local.Now(), c.tick()
		if err := conn.QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&server); err != nil {
			return err
		}
		rtt := c.tick().Sub(before)
		if best < 0 || rtt < best {
			best = rtt
			at, mark = server, before.Add(rtt/2)
			offset = server.Sub(wall.Add(rtt / 2))
		}
	}
	c.mu.Lock()
	c.at, c.mark, c.offset, c.uncertainty, c.lastErr = at, mark, offset, best/2, nil
	c.mu.Unlock()
	return nil
}

// SystemClock is this host's clock for a ServerClock: time.Now, time.After,
// and a monotonic reading that counts the host's sleep (CLOCK_BOOTTIME on
// Linux); Go's stops while suspended, which would put the estimate behind
// by the sleep, and expiries that early.
type SystemClock struct{}

var _ MonotonicClock = SystemClock{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// After waits on real time.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Monotonic returns the time since boot, sleep included, where the system
// has such a clock, and otherwise Go's monotonic time since processStart.
func (SystemClock) Monotonic() time.Duration { return sinceBoot() }

var processStart = time.Now()
