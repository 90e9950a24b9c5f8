package postgres

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/application"
)

// Every host decides expiry on the server's clock, estimated as its time
// at one instant of the local monotonic clock plus the monotonic time
// since: a wall clock step moves nothing.
const (
	ClockSamples = 5           // round trips per measurement; the fastest is kept
	ClockRefresh = time.Minute // how often the server's time is measured again
)

// MonotonicClock is a local clock whose reading a wall clock step does not
// move, on which ServerClock measures elapsed time; other clocks use
// SystemClock's, except a *clock.Mock, whose steps step the estimate.
type MonotonicClock interface {
	application.Clock
	// Monotonic returns the time since a fixed instant; it never decreases.
	Monotonic() time.Duration
}

// ServerClock is the PostgreSQL server's time, estimated on this host; its
// timers are the local clock's.
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

// NewServerClock measures the time of db's server against local until Close.
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

// Now returns the server's estimated current time.
func (c *ServerClock) Now() time.Time {
	c.mu.RLock()
	at, mark := c.at, c.mark
	c.mu.RUnlock()
	return at.Add(c.tick().Sub(mark))
}

var monotonicEpoch = time.Unix(0, 0)

// tick reads the monotonic clock as a time.Time; monotonicEpoch has no
// monotonic component, so Sub of two ticks is that of the readings.
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
// measurement (decisions do not use it), the uncertainty (half the round
// trip), and the last refresh's error.
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
// drift, on a real ticker (it paces I/O).
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

// measure keeps the sample with the shortest round trip, placing the server's reading at its midpoint.
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

// SystemClock is this host's clock. Its monotonic reading counts the host's
// sleep (CLOCK_BOOTTIME on Linux): Go's stops, which would put expiries early.
type SystemClock struct{}

var _ MonotonicClock = SystemClock{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// After waits on real time.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Monotonic returns the time since boot, or since processStart.
func (SystemClock) Monotonic() time.Duration { return sinceBoot() }

var processStart = time.Now()
