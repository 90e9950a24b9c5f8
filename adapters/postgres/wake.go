package postgres

import (
	"context"
	"database/sql"
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

// Wake-ups between processes: LISTEN/NOTIFY, one channel per store (see
// docs/architecture.md, "Hand-over between processes"). Payloads:
//
//	r<type>:<id>            a lock on the resource may have come free
//	*                       any lock may have (a release of several)
//	+<instance>:<type>:<id> the instance watches the resource
//	-<instance>:<type>:<id> it no longer does
//	?<instance>             a new listener: please announce what you watch
//	x<instance>             the instance closed: it watches nothing
//
// An instance is a random id per opened DB: a backend PID changes at every
// reconnect, and would orphan its marks.
const (
	channelPrefix = "cleveragents_locks"
	// Everything watched is announced again every announcePeriod; a mark
	// lives three, so one lost announcement does not drop it.
	announcePeriod  = 10 * time.Second
	remoteTTL       = 3 * announcePeriod
	announceGap     = time.Second // between answers to new listeners' requests
	keepAlive       = 30 * time.Second
	reconnectMin    = 100 * time.Millisecond
	reconnectMax    = 5 * time.Second
	talkTimeout     = 5 * time.Second
	byeTimeout      = 3 * time.Second
	byeShare        = 2
	listenerAppName = "cleveragents-locks listener"
	maxChannel      = 63 // PostgreSQL's longest identifier, in bytes
	// maxWatched bounds a listener's watch locks: the server's lock table
	// is shared, sized by max_locks_per_transaction (64). Past it, waiters poll.
	maxWatched = 64
	watchClass = 0x4c4b5754 // "LKWT", the first key of the watch locks
)

// watchKey is the SQL of the watch lock's second key of the text
// expression name (encodeRef's form), the same in every process.
func watchKey(name string) string { return "hashtext(" + name + ")" }

// watchedOrNotify is the SQL by which a release of typ, id notifies only
// if a listener holds the watch lock; otherwise it holds the lock until its
// commit, so a watch that begins meanwhile sees the release.
func watchedOrNotify(channel, typ, id string) string {
	return "CASE WHEN pg_try_advisory_xact_lock(" + fmt.Sprint(watchClass) + ", " + watchKey(typ+" || ':' || "+id) + ") THEN NULL " +
		"ELSE pg_notify('" + channel + "', 'r' || " + typ + " || ':' || " + id + ") END"
}

// replacedSQL is the statement by which a committed takeover of $1, $2
// tells the replaced holder's watchers, only if someone watches, as a
// release does in its own statement.
func replacedSQL(channel string) string {
	return "SELECT " + watchedOrNotify(channel, "$1::varchar", "$2::varchar")
}

// replacedTimeout bounds a takeover's notice: past it, or if the process
// dies first, the replaced holder learns of its loss at its next renewal.
const replacedTimeout = 2 * time.Second

// notifyReplaced returns the Backend.Replaced of the store on db: a
// statement after the takeover's commit, which a one-statement acquire
// or take could not carry without a channel of its own per store.
func notifyReplaced(db *sql.DB, channel string) func(context.Context, domain.ResourceRef) {
	query := replacedSQL(channel)
	return func(ctx context.Context, ref domain.ResourceRef) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replacedTimeout)
		defer cancel()
		_, _ = db.ExecContext(ctx, query, string(ref.Type), ref.ID)
	}
}

// plainName matches the schema names a channel carries unquoted; others are hashed.
var plainName = regexp.MustCompile(`^[a-z0-9_]+$`)

// channelName returns the channel of the store in schema (channels are per database).
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

// releaseStatement returns the Backend.ReleaseStatement: one lock notifies
// its resource, several "*" once (not a lock per row), without the flush
// (releaseCommit), a row per deleted row so rows affected stay right.
func releaseStatement(channel string) func(deleteSQL string) string {
	typ, id := `"`+entlock.FieldResourceType+`"`, `"`+entlock.FieldResourceID+`"`
	return func(deleteSQL string) string {
		return "WITH d AS (" + deleteSQL + " RETURNING " + typ + ", " + id + ")\n" +
			"SELECT CASE WHEN count(*) OVER () > 1 THEN pg_notify('" + channel + "', '*') ELSE " +
			watchedOrNotify(channel, typ, id) + " END, " + releaseCommit + " FROM d"
	}
}

// listener carries the wake-ups of one opened DB, connecting at the first Watch or Contended.
type listener struct {
	cfg      *pgx.ConnConfig
	channel  string
	instance string
	now      func() time.Time // stamps the others' marks; tests age them

	ctx    context.Context // ends at close, and with it every wait of the loop
	cancel context.CancelFunc
	done   chan struct{} // closed when the loop has returned

	mu        sync.Mutex
	started   bool
	closed    bool
	closing   context.Context // the close in progress, bounding the farewell
	pid       uint32          // the listening backend, 0 while not connected
	watches   map[domain.ResourceRef]map[*watch]struct{}
	held      map[domain.ResourceRef]bool                 // watch locks the connection holds
	pending   map[domain.ResourceRef]bool                 // to announce: true, watched; false, no longer
	hello     bool                                        // ask the others to announce (after a connect)
	fullAt    time.Time                                   // when everything watched is next announced
	lastAll   time.Time                                   // when it last was
	said      bool                                        // something was announced on this connection: say goodbye
	remote    map[domain.ResourceRef]map[string]time.Time // others' marks: when each instance said so
	interrupt context.CancelFunc                          // ends the loop's wait, to send what is pending
	changed   chan struct{}                               // closed and replaced at every change, for tests

	queue placeConn // the places of this store's waiters (queue.go)
}

type watch struct{ c chan struct{} }

var _ application.Wakeups = (*listener)(nil)

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

// Watch implements application.Wakeups; the loop takes the watch lock and
// announces. Past maxWatched it returns a nil channel: the waiter polls.
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

// announce queues news of ref for the loop, with l.mu held.
func (l *listener) announce(ref domain.ResourceRef, on bool) {
	l.pending[ref] = on
	if l.interrupt != nil {
		l.interrupt()
	}
}

// Contended implements application.Wakeups: another instance announced,
// less than remoteTTL ago, that it watches ref (a dead one's marks cost a
// hand-over delay until then, never a lock).
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

// start starts the loop once, with l.mu held.
func (l *listener) start() {
	if !l.started {
		l.started = true
		go l.run()
	}
}

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
	l.closeQueue(ctx)
}

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

// connect LISTENs, then wakes every watcher: a release may have come while nobody listened.
func (l *listener) connect() (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(l.ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(l.ctx, talkTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
		defer cancel()
		_ = conn.Close(ctx)
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

func (l *listener) serve(conn *pgx.Conn) {
	heard := time.Now() // the server's last word, for keepAlive
	for {
		l.mu.Lock()
		payloads := l.outgoing()
		wait, stop := context.WithTimeout(l.ctx, min(max(l.fullAt.Sub(l.now()), 0), keepAlive-time.Since(heard)))
		l.interrupt = stop
		l.mu.Unlock()
		// The watch locks first: whoever hears the announcement may rely on them.
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

// holdWatches takes the watch locks of exactly the watched resources, and
// wakes the watchers of new ones: a release before it did not notify.
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
		l.wake(ref)
	}
	return nil
}

func (l *listener) talk(conn *pgx.Conn, query string, args ...any) error {
	ctx, cancel := context.WithTimeout(l.ctx, talkTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, query, args...)
	return err
}

// outgoing returns the notifications to send now, with l.mu held.
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
			l.wake(ref)
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
		if next := l.lastAll.Add(announceGap); len(l.watches) > 0 && next.Before(l.fullAt) {
			l.fullAt = next
		}
	case 'x':
		l.forget(func(i string, _ time.Time) bool { return i == inst })
	}
}

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
			// Close cut a statement short, closing the connection.
			if c, err := pgx.ConnectConfig(ctx, l.cfg); err == nil {
				say = c
				defer c.Close(ctx)
			}
		}
		_, _ = say.Exec(ctx, "SELECT pg_notify($1, $2)", l.channel, "x"+l.instance)
	}
	_ = conn.Close(ctx)
}

// farewell bounds the goodbye: byeTimeout (a second was too short under
// load), and at most 1/byeShare of what remains of the closer's deadline.
func farewell(closing context.Context) (context.Context, context.CancelFunc) {
	bound := byeTimeout
	if d, ok := closing.Deadline(); ok {
		bound = min(bound, time.Until(d)/byeShare)
	}
	return context.WithTimeout(closing, bound)
}

// wake wakes the watchers of ref, with l.mu held.
func (l *listener) wake(ref domain.ResourceRef) {
	for w := range l.watches[ref] {
		select {
		case w.c <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

func (l *listener) wakeAll() {
	for ref := range l.watches {
		l.wake(ref)
	}
}

func (l *listener) touch() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// encodeRef is a resource as the release statement writes it (a type has no colon).
func encodeRef(ref domain.ResourceRef) string { return string(ref.Type) + ":" + ref.ID }

func decodeRef(s string) (domain.ResourceRef, bool) {
	typ, id, ok := strings.Cut(s, ":")
	return domain.ResourceRef{Type: domain.ResourceType(typ), ID: id}, ok
}
