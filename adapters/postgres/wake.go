package postgres

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// Wake-ups between the processes that share a lock store on PostgreSQL go
// through the server's LISTEN/NOTIFY, on one channel per store (see
// docs/architecture.md, "Hand-over between processes"):
//
//   - Every release that may free an active lock (by owner, by token, all
//     of an owner's) sends a notification from inside its own statement
//     (releaseStatement): the server delivers it at the commit, and only
//     if the transaction commits, at no extra round trip.
//   - Each opened DB has one listener: a connection of its own, outside
//     the pool, that LISTENs on the channel and fans the notifications out
//     to the watchers of this process. It reconnects after a drop, and
//     then wakes every watcher, since notifications were lost meanwhile.
//   - A release of one lock notifies only if someone waits for it: the
//     listener of every process that watches a resource holds a shared
//     advisory lock on the resource's watch key (watchClass, watchKey) on
//     its connection, and the release statement tries the exclusive
//     transaction lock on that key: it notifies when it cannot have it.
//     When it can, it holds it until its commit, so a watch that begins
//     meanwhile is in force only after the release is visible. A watcher
//     is woken once its watch is in force, and looks at the store then:
//     a release either came before, and the watcher sees it, or after,
//     and notifies it. A release of several locks (all an owner's) still
//     notifies "any lock" without asking, as it would otherwise hold an
//     advisory lock per row. A notification costs the server a wake-up of
//     every listener of the database, and each listener's process a
//     message: a release that nobody waits for, the common case, costs
//     neither. (A process of an earlier version does not take the watch
//     locks: its waiters are woken by releases of earlier versions only,
//     and otherwise find the lock free at their next look, within
//     application.waitFallback.)
//   - A process that watches a resource says so on the channel, so that a
//     process that releases it knows that another waits (Contended) and
//     lets it go first.
//
// The payloads (a notification carries at most 8000 bytes; a resource
// type is at most 50 characters and an id 255, so at most about 1.3 kB):
//
//	r<type>:<id>           a lock on the resource may have come free
//	*                      any lock may have (a release of several)
//	+<instance>:<type>:<id> the instance watches the resource
//	-<instance>:<type>:<id> it no longer does
//	?<instance>            a new listener: please announce what you watch
//	x<instance>            the instance closed: it watches nothing
//
// An instance is one opened DB, named by a random id: the listener's
// backend PID would also tell its own notifications apart, but changes
// at every reconnect, which would leave the marks it made before under
// a name nobody removes.
//
// Why announcements rather than asking the server at each release (a
// shared advisory lock per watched resource, held by the listener, that
// the releasing process probes): the probe costs a round trip at every
// release, waited for or not, and the listener's connection would have to
// take and drop a lock at each watch. An announcement costs one
// notification when a process starts and stops watching a resource, and
// one every announcePeriod while it watches (all its resources in one
// statement); Contended is then a map lookup. A process that dies
// without saying so stops announcing, and its marks age out after
// remoteTTL: until then a release of its resource holds the local waiters
// back for handOverGrace for nothing, which costs time but never a lock.

const (
	// channelPrefix names the notification channel of a store; the
	// schema of its locks table, other than public, is added (channelName).
	channelPrefix = "cleveragents_locks"
	// announcePeriod is how often a listener announces again what its
	// process watches, and forgets the others' marks that were not.
	announcePeriod = 10 * time.Second
	// remoteTTL is how long another instance's mark stands without being
	// announced again: three periods, so that a late or lost announcement
	// does not drop it.
	remoteTTL = 3 * announcePeriod
	// announceGap is how soon after an announcement a listener answers a
	// new listener's request for another: at most one a second, however
	// many processes start.
	announceGap = time.Second
	// keepAlive is how long a listener goes without a word from the server
	// before it pings it, so that a connection that died without a reset
	// (a host that vanished) is noticed and replaced.
	keepAlive = 30 * time.Second
	// reconnectMin and reconnectMax bound the pause between attempts to
	// connect again after a drop; it doubles from one to the other.
	reconnectMin = 100 * time.Millisecond
	reconnectMax = 5 * time.Second
	// talkTimeout bounds every statement of the listener (LISTEN, its
	// announcements, a ping); byeTimeout its farewell, which Close waits
	// for.
	talkTimeout = 5 * time.Second
	// byeTimeout is long enough for a loaded server: a farewell that times
	// out leaves this process's marks with the others until they age out
	// (remoteTTL), and a second was seen to be too short under load. A
	// caller that closes with a deadline of its own (DB.CloseContext)
	// shortens it to half of what remains (byeShare), so that a server
	// that went silent does not hold a short command for 3 s.
	byeTimeout = 3 * time.Second
	// byeShare is the share of what remains of a closing caller's
	// deadline that the farewell may take: the rest is left for the
	// pool's connections, which close after it.
	byeShare = 2
	// listenerAppName is the application_name of a listener's connection,
	// for pg_stat_activity, after the DSN's own if it sets one.
	listenerAppName = "cleveragents-locks listener"
	// maxChannel is PostgreSQL's longest identifier, in bytes.
	maxChannel = 63
	// maxWatched bounds the resources one process watches at once, each
	// with a watch lock of its listener: PostgreSQL's lock table is shared
	// by the whole server and sized for max_locks_per_transaction (64 by
	// default) per connection, and a listener holds its locks for as long
	// as their waiters wait. Past the bound, Watch says it cannot watch,
	// and the waiter polls the store (application.Wakeups), as a waiter
	// without wake-ups does.
	maxWatched = 64
	// watchClass is the first key of the advisory locks that say who
	// watches a resource (pg_advisory_lock_shared(watchClass, watchKey)):
	// "LKWT". A program that takes advisory locks of two int4 keys on the
	// same database should leave this class alone.
	watchClass = 0x4c4b5754
)

// watchKey returns the SQL expression of the second key of the watch
// lock of the resource named by the text expression name (encodeRef's
// form: its type, a colon, its id): the server's hash of it, so that the
// statements of every process compute the same key.
func watchKey(name string) string { return "hashtext(" + name + ")" }

// watchedOrNotify returns the SQL expression that, in a release
// statement, notifies channel that a lock on the resource typ, id came
// free if a listener watches it, and otherwise takes its watch lock until
// the commit (see above).
func watchedOrNotify(channel, typ, id string) string {
	return "CASE WHEN pg_try_advisory_xact_lock(" + fmt.Sprint(watchClass) + ", " + watchKey(typ+" || ':' || "+id) + ") THEN NULL " +
		"ELSE pg_notify('" + channel + "', 'r' || " + typ + " || ':' || " + id + ") END"
}

// plainName matches the schema names that a channel's name may carry
// as they are; others are hashed, so that the name needs no quoting in
// a string literal.
var plainName = regexp.MustCompile(`^[a-z0-9_]+$`)

// channelName returns the notification channel of the store whose locks
// table is in schema. Channels are per database, not per schema: stores
// in different schemas of one database get different channels, so that
// neither wakes nor holds back the other's waiters.
func channelName(schema string) string {
	if schema == "public" {
		return channelPrefix
	}
	if name := channelPrefix + "." + schema; len(name) <= maxChannel && plainName.MatchString(schema) {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(schema))
	return fmt.Sprintf("%s.%016x", channelPrefix, h.Sum64())
}

// releaseStatement returns the Backend.ReleaseStatement that notifies
// channel of what a release removed: the resource, for a release of one
// lock that a listener watches, or "*" for several (a release of all an
// owner's locks, whose resources would cost a notification and a watch
// lock each). Identical notifications of one transaction are sent once, so
// several rows still make one "*". It commits without waiting for the
// flush (releaseCommit). The statement returns a row per deleted row, so
// that its rows affected are still the rows deleted.
func releaseStatement(channel string) func(deleteSQL string) string {
	typ, id := `"`+entlock.FieldResourceType+`"`, `"`+entlock.FieldResourceID+`"`
	return func(deleteSQL string) string {
		return "WITH d AS (" + deleteSQL + " RETURNING " + typ + ", " + id + ")\n" +
			"SELECT CASE WHEN count(*) OVER () > 1 THEN pg_notify('" + channel + "', '*') ELSE " +
			watchedOrNotify(channel, typ, id) + " END, " + releaseCommit + " FROM d"
	}
}

// releaseNotice returns the SQL expression, of the resource whose type
// and id are the expressions typ and id, that notifies channel of each
// lock a batch of releases removed that a listener watches, as a lone
// release does.
func releaseNotice(channel string) func(typ, id string) string {
	return func(typ, id string) string { return watchedOrNotify(channel, typ, id) }
}

// listener carries the wake-ups of one opened DB: see above. Its
// connection is opened at the first Watch or Contended, so that a process
// that never waits nor releases (an inspection, a migration) costs the
// server no connection.
type listener struct {
	cfg      *pgx.ConnConfig
	channel  string
	instance string
	// now stamps the others' marks; tests replace it to age them out.
	now func() time.Time

	ctx    context.Context // ends at close, and with it every wait of the loop
	cancel context.CancelFunc
	done   chan struct{} // closed when the loop has returned

	mu      sync.Mutex
	started bool
	closed  bool
	// closing is the context of the close in progress, which bounds the
	// farewell (farewell); set with closed, before ctx ends.
	closing context.Context
	pid     uint32 // the listening backend, 0 while not connected
	watches map[domain.ResourceRef]map[*watch]struct{}
	// held are the resources whose watch lock the connection holds.
	held map[domain.ResourceRef]bool
	// pending holds what this process must still announce: true, that it
	// watches a resource; false, that it no longer does.
	pending map[domain.ResourceRef]bool
	hello   bool      // ask the others to announce (after a connect)
	fullAt  time.Time // when everything watched is next announced
	lastAll time.Time // when it last was
	said    bool      // something was announced on this connection: say goodbye
	// remote holds the others' marks: per resource, the instances that
	// announced they watch it, and when they last did.
	remote map[domain.ResourceRef]map[string]time.Time
	// interrupt ends the loop's current wait for a notification, so that
	// it sends what is pending.
	interrupt context.CancelFunc
	// changed is closed and replaced at every change of the state above
	// that a test may wait for.
	changed chan struct{}
}

type watch struct{ c chan struct{} }

var _ application.Wakeups = (*listener)(nil)

// newListener returns the listener of a store on channel, which connects
// with cfg (a copy of the pool's) when first used.
func newListener(cfg *pgx.ConnConfig, channel string) *listener {
	cfg = cfg.Copy()
	name := listenerAppName
	if app := cfg.RuntimeParams["application_name"]; app != "" {
		name = app + " (" + listenerAppName + ")"
	}
	cfg.RuntimeParams["application_name"] = name
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{
		cfg: cfg, channel: channel, instance: fmt.Sprintf("%016x", rand.Uint64()), now: time.Now,
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
		watches: make(map[domain.ResourceRef]map[*watch]struct{}),
		held:    make(map[domain.ResourceRef]bool),
		pending: make(map[domain.ResourceRef]bool),
		remote:  make(map[domain.ResourceRef]map[string]time.Time),
		changed: make(chan struct{}),
	}
}

// Watch implements application.Wakeups. It never waits for the server:
// the watch lock and the announcement are sent by the listener's loop.
// Past maxWatched resources, it returns a nil channel: the waiter polls.
func (l *listener) Watch(ref domain.ResourceRef) (<-chan struct{}, func()) {
	w := &watch{c: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return w.c, func() {}
	}
	l.start()
	subs := l.watches[ref]
	if subs == nil && len(l.watches) >= maxWatched {
		return nil, func() {}
	}
	if subs == nil {
		subs = make(map[*watch]struct{})
		l.watches[ref] = subs
		l.announce(ref, true)
	}
	subs[w] = struct{}{}
	var once sync.Once
	return w.c, func() { once.Do(func() { l.unwatch(ref, w) }) }
}

func (l *listener) unwatch(ref domain.ResourceRef, w *watch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	subs := l.watches[ref]
	delete(subs, w)
	if len(subs) == 0 {
		delete(l.watches, ref)
		if !l.closed {
			l.announce(ref, false)
		}
	}
}

// announce queues the news that this process watches ref (on) or no
// longer does, and has the loop send it, with l.mu held.
func (l *listener) announce(ref domain.ResourceRef, on bool) {
	l.pending[ref] = on
	if l.interrupt != nil {
		l.interrupt()
	}
}

// Contended implements application.Wakeups: whether another instance
// announced, less than remoteTTL ago, that it watches ref. The first call
// starts the listener, and is false: nothing was heard yet.
func (l *listener) Contended(ref domain.ResourceRef) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.start()
	since := l.now().Add(-remoteTTL)
	for _, at := range l.remote[ref] {
		if at.After(since) {
			return true
		}
	}
	return false
}

// start starts the loop, once, with l.mu held.
func (l *listener) start() {
	if !l.started {
		l.started = true
		go l.run()
	}
}

// close stops the loop, which says goodbye if it announced anything, and
// closes its connection, within byeTimeout and within half of what
// remains of ctx (farewell).
func (l *listener) close(ctx context.Context) {
	if l == nil {
		return
	}
	l.mu.Lock()
	started := l.started
	l.closed = true
	l.closing = ctx
	l.mu.Unlock()
	l.cancel()
	if started {
		<-l.done
	}
}

// run connects, listens and reconnects after every drop until close.
// Pauses between attempts are on real time: they pace I/O, and the
// adapter has no clock of its own.
func (l *listener) run() {
	defer close(l.done)
	backoff := reconnectMin
	for {
		if conn, err := l.connect(); err == nil {
			began := time.Now()
			l.serve(conn)
			l.hangUp(conn)
			if time.Since(began) >= reconnectMax {
				backoff = reconnectMin // it had been up for a while: try at once
				continue
			}
		}
		if l.ctx.Err() != nil {
			return
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, reconnectMax)
	}
}

// connect opens the listener's connection and LISTENs. Once it listens,
// every watcher is woken (a release may have come while it was not
// listening), and the next turn of the loop asks the others to announce
// and announces everything this process watches.
func (l *listener) connect() (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(l.ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(l.ctx, talkTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		l.closeConn(conn)
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pid = conn.PgConn().PID()
	l.hello, l.fullAt, l.said = true, time.Time{}, false
	clear(l.held) // a new session holds no lock
	l.wakeAll()
	l.touch()
	return conn, nil
}

// serve sends what is pending and waits for notifications until the
// connection fails or the listener closes.
func (l *listener) serve(conn *pgx.Conn) {
	heard := time.Now() // the server's last word, for keepAlive
	for {
		l.mu.Lock()
		payloads := l.outgoing()
		wait, stop := context.WithTimeout(l.ctx, min(max(l.fullAt.Sub(l.now()), 0), keepAlive-time.Since(heard)))
		l.interrupt = stop
		l.mu.Unlock()
		// The watch locks first: a process that hears this one's
		// announcement may rely on its watch being in force.
		if err := l.holdWatches(conn); err != nil {
			stop()
			return
		}
		if len(payloads) > 0 {
			if err := l.talk(conn, "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p", l.channel, payloads); err != nil {
				stop()
				return
			}
			heard = time.Now()
		}
		n, err := conn.WaitForNotification(wait)
		stop()
		switch {
		case err == nil:
			heard = time.Now()
			l.receive(n.Payload)
		case l.ctx.Err() != nil || conn.IsClosed() || wait.Err() == nil:
			return // closing, or the connection failed
		case time.Since(heard) >= keepAlive:
			if err := l.talk(conn, "SELECT 1"); err != nil {
				return
			}
			heard = time.Now()
		}
	}
}

// holdWatches makes the connection hold the watch lock of every resource
// this process watches, and of no other, and then wakes the watchers of
// the resources whose watch has just come into force: a release that came
// before it did not notify, and they must look at the store.
func (l *listener) holdWatches(conn *pgx.Conn) error {
	l.mu.Lock()
	var take, drop []string
	var taken []domain.ResourceRef
	for ref := range l.watches {
		if !l.held[ref] {
			take, taken = append(take, encodeRef(ref)), append(taken, ref)
		}
	}
	for ref := range l.held {
		if l.watches[ref] == nil {
			drop = append(drop, encodeRef(ref))
			delete(l.held, ref) // on a failure, the session goes, and the lock with it
		}
	}
	l.mu.Unlock()
	const each = "FROM unnest($2::text[]) AS p"
	if len(drop) > 0 {
		if err := l.talk(conn, "SELECT pg_advisory_unlock_shared($1::int4, "+watchKey("p")+") "+each, watchClass, drop); err != nil {
			return err
		}
	}
	if len(take) == 0 {
		return nil
	}
	if err := l.talk(conn, "SELECT pg_advisory_lock_shared($1::int4, "+watchKey("p")+") "+each, watchClass, take); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.touch()
	for _, ref := range taken {
		l.held[ref] = true // unwatched meanwhile: dropped at the next turn
		for w := range l.watches[ref] {
			signal(w.c)
		}
	}
	return nil
}

// talk runs one statement of the listener, within talkTimeout.
func (l *listener) talk(conn *pgx.Conn, query string, args ...any) error {
	ctx, cancel := context.WithTimeout(l.ctx, talkTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, query, args...)
	return err
}

// outgoing returns the notifications to send now, with l.mu held: a
// request for the others' announcements after a connect, what changed
// in what this process watches, and, every announcePeriod, everything it
// watches (when it also forgets the others' marks that have aged out).
// An announcement lost with a connection that failed is covered by the
// one after the reconnect, or ages out.
func (l *listener) outgoing() []string {
	var out []string
	if l.hello {
		out = append(out, "?"+l.instance)
		l.hello = false
	}
	now := l.now()
	if !now.Before(l.fullAt) {
		for ref := range l.watches {
			l.pending[ref] = true
		}
		l.fullAt, l.lastAll = now.Add(announcePeriod), now
		since := now.Add(-remoteTTL)
		l.forget(func(_ string, at time.Time) bool { return !at.After(since) })
	}
	for ref, on := range l.pending {
		sign := "-"
		if on {
			sign = "+"
			l.said = true
		}
		out = append(out, sign+l.instance+":"+encodeRef(ref))
	}
	clear(l.pending)
	return out
}

// forget drops the others' marks for which drop is true: an instance,
// and when it last announced the mark.
func (l *listener) forget(drop func(inst string, at time.Time) bool) {
	for ref, marks := range l.remote {
		for inst, at := range marks {
			if drop(inst, at) {
				delete(marks, inst)
			}
		}
		if len(marks) == 0 {
			delete(l.remote, ref)
		}
	}
}

// receive acts on one notification.
func (l *listener) receive(payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.touch()
	if payload == "" {
		return
	}
	kind, rest := payload[0], payload[1:]
	switch kind {
	case '*':
		l.wakeAll()
		return
	case 'r':
		if ref, ok := decodeRef(rest); ok {
			for w := range l.watches[ref] {
				signal(w.c)
			}
		}
		return
	}
	inst, refText, _ := strings.Cut(rest, ":")
	if inst == l.instance {
		return // this listener's own announcement
	}
	switch kind {
	case '+', '-':
		ref, ok := decodeRef(refText)
		switch {
		case !ok:
		case kind == '+':
			if l.remote[ref] == nil {
				l.remote[ref] = make(map[string]time.Time)
			}
			l.remote[ref][inst] = l.now()
		default:
			delete(l.remote[ref], inst)
			if len(l.remote[ref]) == 0 {
				delete(l.remote, ref)
			}
		}
	case '?':
		// A new listener: announce everything soon, but at most once
		// every announceGap however many arrive.
		if len(l.watches) > 0 {
			l.fullAt = minTime(l.fullAt, l.lastAll.Add(announceGap))
		}
	case 'x':
		l.forget(func(i string, _ time.Time) bool { return i == inst })
	}
}

// hangUp closes the connection; when the listener is closing, it first
// tells the others that this process watches nothing any more, if it had
// said it watched something.
func (l *listener) hangUp(conn *pgx.Conn) {
	l.mu.Lock()
	bye := l.closed && l.said
	closing := l.closing
	l.pid, l.interrupt = 0, nil
	l.touch()
	l.mu.Unlock()
	if closing == nil {
		closing = context.Background() // a drop, not a close: no caller waits
	}
	ctx, cancel := farewell(closing)
	defer cancel()
	if bye && ctx.Err() == nil {
		say := conn
		if conn.IsClosed() {
			// Close cut a statement of the loop short, which closes
			// the connection: say goodbye on one of its own, within
			// the same bound.
			if c, err := pgx.ConnectConfig(ctx, l.cfg); err == nil {
				say = c
				defer closeConn(ctx, c)
			}
		}
		_, _ = say.Exec(ctx, "SELECT pg_notify($1, $2)", l.channel, "x"+l.instance)
	}
	closeConn(ctx, conn)
}

// farewell returns the context that bounds the listener's farewell and
// the closing of its connection: byeTimeout, and at most 1/byeShare of
// what remains of closing, the context of the close in progress. A
// farewell cut short costs the others a hand-over delay until this
// process's marks age out (remoteTTL), never a lock; a caller that
// closes within a deadline, such as a command of the CLI against a
// server that went silent, must not wait a fixed 3 s beyond it.
func farewell(closing context.Context) (context.Context, context.CancelFunc) {
	bound := byeTimeout
	if d, ok := closing.Deadline(); ok {
		bound = min(bound, time.Until(d)/byeShare)
	}
	return context.WithTimeout(closing, bound)
}

func (l *listener) closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
	defer cancel()
	closeConn(ctx, conn)
}

// closeConn closes conn within ctx: pgx sends the server its Terminate
// message and closes the socket, waiting at most until ctx ends.
func closeConn(ctx context.Context, conn *pgx.Conn) { _ = conn.Close(ctx) }

// wakeAll wakes every watcher, with l.mu held.
func (l *listener) wakeAll() {
	for _, subs := range l.watches {
		for w := range subs {
			signal(w.c)
		}
	}
}

// touch tells the tests waiting for a change that one happened, with
// l.mu held.
func (l *listener) touch() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// encodeRef and decodeRef write a resource into a payload, as the
// release statement does: its type, a colon, its id. A type has no
// colon (domain.ResourceType.Valid).
func encodeRef(ref domain.ResourceRef) string { return string(ref.Type) + ":" + ref.ID }

func decodeRef(s string) (domain.ResourceRef, bool) {
	typ, id, ok := strings.Cut(s, ":")
	return domain.ResourceRef{Type: domain.ResourceType(typ), ID: id}, ok
}
