package postgres

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/application"
)

// Server time. Every host that shares a PostgreSQL lock store decides
// expiry with the same clock: the server's. Reading it in every statement
// would cost a round trip on the hot path, so ServerClock reads it over a
// few round trips, keeps the server's time at one instant of the local
// monotonic clock, and estimates the server's time later as that time
// plus the monotonic time elapsed since; it measures again in the
// background. The local wall clock plays no part in the estimate: a step
// of it (NTP stepping the clock, date -s) moves nothing, and hosts
// whose clocks disagree by minutes agree on every expiry up to the
// estimate's uncertainty: half the round trip of the best sample, plus
// how far the local monotonic clock drifts from the server's between two
// measurements (NTP slews both; a few microseconds a minute without it).
const (
	// ClockSamples is how many round trips one measurement makes; the
	// fastest one, whose midpoint is the most certain, is kept.
	ClockSamples = 5
	// ClockRefresh is how often the server's time is measured again.
	ClockRefresh = time.Minute
)

// MonotonicClock is a local clock that also has a monotonic reading: one
// that a step of the wall clock does not move. ServerClock measures
// elapsed time with it when the local clock implements it. A local clock
// that does not is used for its wall time only (Offset): elapsed time is
// then measured on this host's monotonic clock (SystemClock's), whatever the
// clock's readings carry, so that a clock returning time.Now().UTC()
// (which strips the monotonic reading) cannot let a wall step move the
// server's estimated time. The one exception is a *clock.Mock of
// github.com/benbjohnson/clock: its time is the test's, and elapsed time
// is measured on it, so stepping it (Add, Set) is stepping the test's
// time, and the server's estimated time moves with it.
type MonotonicClock interface {
	application.Clock
	// Monotonic returns the time elapsed since an instant of the clock's
	// choosing, which never changes; it never decreases.
	Monotonic() time.Duration
}

// ServerClock is the PostgreSQL server's time, estimated on this host.
// It satisfies application.Clock and application.Timers; its timers are
// the local clock's (a duration is the same on both).
type ServerClock struct {
	local application.Clock
	// mono is the monotonic clock that elapsed time is measured on; nil
	// for a *clock.Mock, whose Now is the test's time.
	mono   func() time.Duration
	timers application.Timers
	db     *sql.DB

	mu sync.RWMutex
	// at is the server's time at the instant mark of the local monotonic
	// clock (see tick).
	at, mark    time.Time
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
		// The host's own monotonic clock (SystemClock's, which counts
		// sleep too): the local clock's readings may carry no monotonic
		// component.
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

// monotonicEpoch is where tick places a MonotonicClock's readings: a time
// without a monotonic component, so that Sub of two of them is the
// difference of the readings.
var monotonicEpoch = time.Unix(0, 0)

// tick reads the monotonic clock as a time.Time, for Sub: mono's reading,
// or a *clock.Mock's Now, which is the test's time.
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

// Offset returns the server's time minus the local wall clock's at the
// last measurement (what the host's clock is off by; decisions do not use
// it), how uncertain the server's estimated time is (half the round trip
// it was measured over), and the error of the last refresh, if it failed
// (the previous measurement is then still in use).
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

// refresh measures the server's time again every ClockRefresh, which
// corrects the drift of the local monotonic clock. It paces I/O on a real
// ticker: the measurement is the same whatever the local clock shows.
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
// sample with the shortest round trip: the server read its clock within
// that round trip, so at its midpoint up to half of it. The round trip is
// timed on the monotonic clock, and the wall clock is read only for
// Offset.
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
