package postgres

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/application"
)

// Every host decides expiry on the server's clock, estimated as its time
// at one instant of the local monotonic clock plus the monotonic time
// since: a wall clock step moves nothing. Each acquire and renewal reads
// the server's clock too, and re-anchors an estimate that it shows wrong.
const (
	ClockSamples = 5           // round trips per measurement; the fastest is kept
	ClockRefresh = time.Minute // how often the server's time is measured again
)

// remeasurePace spaces the measurements that a re-anchoring asks for, so
// that a host whose clock keeps disagreeing costs the server little.
const remeasurePace = time.Second

// MonotonicClock is a local clock whose reading a wall clock step does not
// move, on which ServerClock measures elapsed time; other clocks use
// SystemClock's, except a *clock.Mock, whose steps step the estimate until
// the server's time, read again, disagrees.
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
	since, got  time.Time // the ticks between which the readings the estimate rests on were made
	ambiguous   bool      // it rests on two readings that disagree, neither known to be the later
	offset      time.Duration
	uncertainty time.Duration
	lastErr     error

	last  atomic.Int64  // the latest tick read, since monotonicEpoch: a statement's send is after it
	store *serverClocks // whose statements re-anchor it; nil for a read-only DB
	kick  chan struct{} // a re-anchoring asks for a measurement
	stop  chan struct{}
	done  chan struct{}
}

var (
	_ application.Clock  = (*ServerClock)(nil)
	_ application.Timers = (*ServerClock)(nil)
)

// NewServerClock measures the time of db's server against local until Close.
//
// Errors: a *domain.StoreError when the server cannot be asked its time.
func NewServerClock(ctx context.Context, db *DB, local application.Clock) (*ServerClock, error) {
	c := &ServerClock{local: local, db: db.sql, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
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
	if db.store != nil {
		c.store = db.store.clocks
		c.store.add(c)
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
	var t time.Time
	if c.mono != nil {
		t = monotonicEpoch.Add(c.mono())
	} else {
		t = c.local.Now()
	}
	c.last.Store(int64(t.Sub(monotonicEpoch)))
	return t
}

// lastTick is the latest tick read (by Now, before every decision): an
// instant before a statement sent now, at no cost.
func (c *ServerClock) lastTick() time.Time {
	return monotonicEpoch.Add(time.Duration(c.last.Load()))
}

// After waits on the local clock.
func (c *ServerClock) After(d time.Duration) <-chan time.Time {
	if c.timers != nil {
		return c.timers.After(d)
	}
	return time.After(d)
}

// Offset returns what the local wall clock was off by at the last
// measurement or re-anchoring (decisions do not use it), the uncertainty
// (half the round trip of the reading the estimate is anchored on; more,
// to cover both, while two readings disagree and neither is known to be
// the later, until the measurement that tells), and the last refresh's
// error.
func (c *ServerClock) Offset() (offset, uncertainty time.Duration, err error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.offset, c.uncertainty, c.lastErr
}

// Close stops the refreshes and the re-anchoring.
func (c *ServerClock) Close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
		if c.store != nil {
			c.store.remove(c)
		}
	}
	<-c.done
}

// refresh measures again every ClockRefresh, correcting the monotonic
// drift, and soon after a re-anchoring, whose reading's round trip (a
// write's, with its waits) makes a loose uncertainty; on real time (it
// paces I/O).
func (c *ServerClock) refresh() {
	defer close(c.done)
	t := time.NewTicker(ClockRefresh)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.kick:
			if wait := remeasurePace - time.Since(last); wait > 0 {
				select {
				case <-c.stop:
					return
				case <-time.After(wait):
				}
			}
		}
		last = time.Now()
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
	var at, sent, got time.Time
	var offset time.Duration
	for range ClockSamples + 1 {
		var server time.Time
		wall, before := c.local.Now(), c.tick()
		if err := conn.QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&server); err != nil {
			return err
		}
		after := c.tick()
		rtt := after.Sub(before)
		if best < 0 || rtt < best {
			best = rtt
			at, sent, got = server, before, after
			offset = server.Sub(wall.Add(rtt / 2))
		}
	}
	c.mu.Lock()
	kick := c.take(sent, got, at, offset, true)
	c.lastErr = nil
	c.mu.Unlock()
	if kick {
		c.remeasure()
	}
	return nil
}

// observe takes server, the server's clock read by a statement asked for
// at tick sent and answered at tick got: the server read it in between.
// An estimate that this shows wrong beyond the uncertainty it states (the
// server's clock stepped, the host's monotonic clock stood still or
// drifted) is corrected (see take), and a measurement is asked for to
// narrow its uncertainty again; a later reading settles an ambiguous one.
func (c *ServerClock) observe(sent, got, server time.Time) {
	c.mu.RLock()
	weigh := c.ambiguous || c.disagrees(sent, got, server)
	c.mu.RUnlock()
	if !weigh {
		return
	}
	c.mu.Lock()
	kick := c.take(sent, got, server, server.Sub(c.local.Now().Add(-got.Sub(sent)/2)), false)
	c.mu.Unlock()
	if kick {
		c.remeasure()
	}
}

// remeasure asks the refresh for a measurement.
func (c *ServerClock) remeasure() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// take weighs the reading server, made between ticks sent and got, against
// the estimate, and reports whether a measurement is needed. Only the
// order of the readings tells which is right when they disagree (the
// server's clock moved between them): a reading asked for once the
// estimate's were all answered is the later, and is taken; one answered
// before the estimate's were asked for is the earlier, and is dropped. A
// reading made in the same span as the estimate's may be either: when it
// disagrees, the estimate is widened to cover both (on the later of the
// two, which decides an expiry no earlier than the server: a lock never
// changes hands on the estimate alone) until a measurement, asked for at
// once, tells. A measurement (measured) that agrees narrows the estimate,
// but never an ambiguous one. Under c.mu.
func (c *ServerClock) take(sent, got, server time.Time, offset time.Duration, measured bool) (kick bool) {
	half := got.Sub(sent) / 2
	anchor := func() {
		c.at, c.mark, c.since, c.got, c.offset, c.uncertainty, c.ambiguous = server, sent.Add(half), sent, got, offset, half, false
	}
	wrong := c.disagrees(sent, got, server)
	switch {
	case !sent.Before(c.got): // the later: it settles an ambiguous estimate too
		if measured || wrong || c.ambiguous && half < c.uncertainty {
			anchor()
			return !measured
		}
		return false
	case !c.since.Before(got): // the earlier
		return false
	case !wrong:
		if measured && !c.ambiguous && !sent.Before(c.since) {
			since, got := c.since, later(c.got, got)
			anchor()
			c.since, c.got = since, got
		}
		return false
	}
	// Either may be the later: the estimate covers both until a measurement.
	d := server.Sub(c.at.Add(sent.Add(half).Sub(c.mark))) // the reading's estimate less this one
	if d > 0 {
		u := max(half, d+c.uncertainty)
		c.at, c.mark, c.offset, c.uncertainty = server, sent.Add(half), offset, u
	} else {
		c.uncertainty = max(c.uncertainty, -d+half)
	}
	c.since, c.got, c.ambiguous = earlier(c.since, sent), later(c.got, got), true
	return true
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// disagrees reports whether the estimate, within its uncertainty, is
// behind server at got or ahead of it at sent (server is truncated to the
// microsecond: the reading was made before server plus one). Under c.mu.
func (c *ServerClock) disagrees(sent, got, server time.Time) bool {
	behind := c.at.Add(got.Sub(c.mark)).Add(c.uncertainty).Before(server)
	ahead := c.at.Add(sent.Sub(c.mark)).Add(-c.uncertainty).After(server.Add(time.Microsecond))
	return behind || ahead
}

// serverClocks are the ServerClocks open on one store: copied on write,
// so that a statement reads them without a lock.
type serverClocks struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*ServerClock]
}

func (s *serverClocks) load() []*ServerClock {
	if p := s.list.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *serverClocks) add(c *ServerClock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := append(slices.Clone(s.load()), c)
	s.list.Store(&l)
}

func (s *serverClocks) remove(c *ServerClock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := slices.DeleteFunc(slices.Clone(s.load()), func(o *ServerClock) bool { return o == c })
	s.list.Store(&l)
}

// clockSend is a statement's sending, on the ticks of each ServerClock of
// its store.
type clockSend struct {
	clocks []*ServerClock
	ticks  []time.Time
}

// send reads the ticks of s's clocks before a statement is sent: the
// latest each read, since reading a monotonic clock that counts a suspend
// is a system call (the answer's is read anew).
func (s *serverClocks) send() clockSend {
	if s == nil {
		return clockSend{}
	}
	cs := s.load()
	if len(cs) == 0 {
		return clockSend{}
	}
	ticks := make([]time.Time, len(cs))
	for i, c := range cs {
		ticks[i] = c.lastTick()
	}
	return clockSend{clocks: cs, ticks: ticks}
}

// answered takes the server's time that the statement sent read.
func (s clockSend) answered(server time.Time) {
	for i, c := range s.clocks {
		c.observe(s.ticks[i], c.tick(), server)
	}
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
