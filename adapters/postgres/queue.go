package postgres

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The queue of the waiters of every process and host on one schema
// (docs/locks.md, "Order of waiters"): a place is a transaction id, which
// the server hands out in one order to every session, and a session
// advisory lock (shared) on the two int4 keys (the resource's hash, the
// id's low 32 bits), held by a connection the store keeps for its places.
// The server drops the lock when that session ends, at Close or when the
// process dies and its connection with it, so a dead waiter is never
// ahead of anyone. A waiter is ahead of another when another session holds
// a lock of the same resource with an earlier id, which pg_locks shows:
// one query, on the places' own connection.

// queueAppName names the places' connection in pg_stat_activity.
const queueAppName = "cleveragents-locks queue"

// queueJoinSQL takes a place for the resource key $1: a new transaction
// id, its lock, and whether a place is ahead of it.
const queueJoinSQL = `WITH t AS (SELECT txid_current() % 4294967296 AS n)
SELECT n, pg_try_advisory_lock_shared($1::int4, (n - CASE WHEN n >= 2147483648 THEN 4294967296 ELSE 0 END)::int4), ` + queueAheadExpr + ` FROM t`

// queueAheadExpr is true when another session holds a place of the
// resource key $1 with an id up to 2^31-1 before n (ids wrap, as the
// server's own do).
const queueAheadExpr = `EXISTS (` + queuePlacesAhead + `)`

// queuePlacesAhead selects the places of other sessions ahead of n: held
// shared locks (a place is one), never an exclusive advisory lock of the
// application or of an owner claim that meets a place's key, nor a request
// still waiting.
const queuePlacesAhead = `SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND mode = 'ShareLock'
 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
 AND classid = ($1::int4::int8 & 4294967295)::oid AND pid <> pg_backend_pid()
 AND ((n - objid::int8) % 4294967296 + 4294967296) % 4294967296 BETWEEN 1 AND 2147483647`

// queueAheadSQL counts the places ahead of $2 (each place is a lock of its own id).
const queueAheadSQL = `SELECT count(*) FROM (SELECT $2::int8 AS n) t, LATERAL (` + queuePlacesAhead + `) a`

// errNoPlace: the server gave no place (the lock's key is taken
// exclusively); the waiter goes on without the order.
var errNoPlace = errors.New("postgres: no place in the queue of waiters")

// placeConn is a store's connection for its places, opened at the first Join
// and again after it fails (its places are gone with it: theirs is no
// order any more, and they look no further).
type placeConn struct {
	mu     sync.Mutex
	conn   *pgx.Conn
	closed bool
}

var _ application.Queue = (*listener)(nil)

type pgPlace struct {
	l    *listener
	conn *pgx.Conn // the session holding the place's lock
	ref  domain.ResourceRef
	key  int32
	n    int64
	once sync.Once
}

// queueKey is the first key of ref's places in the store on channel
// (one per schema): a 32-bit hash, never the watch locks' class. Two
// resources whose keys meet share one queue.
func queueKey(channel string, ref domain.ResourceRef) int32 {
	h := fnv.New32a()
	h.Write([]byte(channel))
	h.Write([]byte{0})
	h.Write([]byte(encodeRef(ref)))
	k := int32(h.Sum32())
	if k == watchClass {
		k ^= 1
	}
	return k
}

// queueConn returns the places' connection, connecting if need be, with q.mu held.
func (l *listener) queueConn(ctx context.Context) (*pgx.Conn, error) {
	q := &l.queue
	if q.closed {
		return nil, domain.ErrClosed
	}
	if q.conn != nil && !q.conn.IsClosed() {
		return q.conn, nil
	}
	if q.conn != nil {
		closeConn(q.conn)
		q.conn = nil
	}
	cfg := l.cfg.Copy()
	cfg.RuntimeParams["application_name"] = queueAppName
	ctx, cancel := placeContext(ctx)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// The session mostly idles: idle_session_timeout must not end it. A
	// place's transaction id makes its statement commit a record: nothing
	// a crash must keep, so it does not wait for the WAL flush.
	if _, err := conn.Exec(ctx, "SELECT set_config('synchronous_commit', 'off', false), "+
		"CASE WHEN current_setting('server_version_num')::int >= 140000 THEN set_config('idle_session_timeout', '0', false) END"); err != nil {
		closeConn(conn)
		return nil, err
	}
	q.conn = conn
	return conn, nil
}

// leaveTimeout bounds a place's leaving: one statement a healthy server
// answers in a millisecond.
const leaveTimeout = 250 * time.Millisecond

// placeContext bounds a statement of the places' connection by
// talkTimeout, and by the waiter's deadline, but not by a cancellation
// of its context: pgx would close the connection, and every place of this
// store with it. A deadline that passes does close it: a server that does
// not answer in time must not hold the waiter past its deadline (its
// places are then gone and their waiters go on unordered).
func placeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := talkTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)) // a waiter's deadline bounds its place's talk too
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// Join implements application.Queue.
func (l *listener) Join(ctx context.Context, ref domain.ResourceRef) (application.Place, bool, error) {
	q := &l.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	conn, err := l.queueConn(ctx)
	if err != nil {
		return nil, false, err
	}
	p := &pgPlace{l: l, conn: conn, ref: ref, key: queueKey(l.channel, ref)}
	ctx, cancel := placeContext(ctx)
	defer cancel()
	var got, ahead bool
	if err := conn.QueryRow(ctx, queueJoinSQL, p.key).Scan(&p.n, &got, &ahead); err != nil {
		return nil, false, err
	}
	if !got {
		return nil, false, errNoPlace
	}
	return p, ahead, nil
}

// Ahead implements application.Place. A place whose session ended is no
// longer in the queue: it is ahead of nobody, and nobody of it.
func (p *pgPlace) Ahead(ctx context.Context) (int, error) {
	q := &p.l.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn != p.conn || p.conn.IsClosed() {
		return 0, nil
	}
	ctx, cancel := placeContext(ctx)
	defer cancel()
	var ahead int
	if err := p.conn.QueryRow(ctx, queueAheadSQL, p.key, p.n).Scan(&ahead); err != nil {
		return 0, err
	}
	return ahead, nil
}

// Leave implements application.Place. It returns once the place is
// gone, before the caller can release the lock it took: the next waiter,
// woken by that release, must not find it still ahead. One that left
// without the lock notifies its resource's watchers, since it may be free.
func (p *pgPlace) Leave(took bool) {
	p.once.Do(func() {
		q := &p.l.queue
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.closed || q.conn != p.conn || p.conn.IsClosed() {
			return // its session, and the place with it, is gone or going
		}
		// Bounded by leaveTimeout, not talkTimeout: Leave holds the places'
		// connection, and a server gone silent must not keep this store's
		// next Join (a CLI's next round, with its own deadline) waiting
		// behind it. A timeout closes the connection, and the places with it.
		ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
		defer cancel()
		k2 := int32(uint32(p.n))
		if took {
			_, _ = p.conn.Exec(ctx, "SELECT pg_advisory_unlock_shared($1::int4, $2::int4)", p.key, k2)
			return
		}
		_, _ = p.conn.Exec(ctx, "SELECT pg_advisory_unlock_shared($1::int4, $2::int4), "+
			watchedOrNotify(p.l.channel, "$3::varchar", "$4::varchar"), p.key, k2, string(p.ref.Type), p.ref.ID)
	})
}

// closeQueue ends the places' session, and with it every place left.
func (l *listener) closeQueue(ctx context.Context) {
	q := &l.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if q.conn != nil {
		_ = q.conn.Close(ctx)
		q.conn = nil
	}
}
