package postgres

import (
	"context"
	"crypto/tls"
	"database/sql"
	"database/sql/driver"
	"errors"
	"hash/fnv"
	"net"
	"strings"
	"sync"
	"time"

	"entgo.io/ent/dialect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// writeAttempts and readAttempts bound the tries of a write aborted by a
// serialization failure or deadlock, and of a read whose connection ended.
const writeAttempts, readAttempts = 4, 4

// DB is an open lock store on PostgreSQL. It is safe for concurrent use.
type DB struct {
	sql   *sql.DB
	conns *pool // the pool's connections, to cut when the server is silent
	store *LockRepository
	wake  *listener // nil when opened for inspection
}

// Options tune Open. The zero value is the recommended setting.
type Options struct {
	// MaxConns bounds the connections of the pool; zero means 10.
	MaxConns int
	// LocalTime decides expiry on the service's clock alone (a test's mock
	// clock). By default a lock changes hands, and is purged, only once it
	// has expired on the server's clock too: an estimate (ServerClock) can
	// run ahead of the server over an asymmetric link.
	LocalTime bool
	// DisableGroupCommit runs every acquire, renewal and release as a
	// statement of its own, rather than batched with those in flight.
	DisableGroupCommit bool
}

// Open connects to the database that dsn names (a URL or key=value
// string, as pgx accepts), applies the pending migrations under a session
// lock, and returns the store. It refuses a pooler in transaction or
// statement mode (pooler.go).
//
// Errors: a *domain.StoreError whose kind names the cause; of kind
// StoreUnreachable, matching ErrTransactionPooling, for a pooler that
// shares server sessions between connections.
func Open(ctx context.Context, dsn string, opts Options) (*DB, error) {
	op := "open lock store " + Redact(dsn)
	cfg, err := pgx.ParseConfig(WithConnectTimeout(dsn))
	if err != nil {
		return nil, storeError(op, domain.StoreUnreachable, errors.New(Redact(err.Error())))
	}
	// At READ COMMITTED a transaction that waited on a resource's advisory
	// lock sees the row its predecessor left; above it, contention would
	// surface as unique violations or serialization failures. A startup
	// parameter overrides every default, and the DSN's "options".
	cfg.RuntimeParams["default_transaction_isolation"] = "read committed"
	// Every statement finds its rows by an index, whatever its values: a
	// custom plan would cost about what a batch's execution does.
	if _, set := cfg.RuntimeParams["plan_cache_mode"]; !set {
		cfg.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	// The churning table's statistics miss its dead rows, so the planner
	// takes a scan for cheap, which reads them all at every execution (13 %
	// of the server's CPU at 32 callers); every statement has an index.
	if _, set := cfg.RuntimeParams["enable_seqscan"]; !set {
		cfg.RuntimeParams["enable_seqscan"] = "off"
	}
	sdb, conns, params := openPool(cfg, opts.MaxConns, 10, nil)
	sdb.SetConnMaxIdleTime(5 * time.Minute)
	if err := params.open(ctx, op, sdb, cfg); err != nil {
		sdb.Close()
		return nil, entstore.Explain(ctx, err, op, FormatError)
	}
	db := &DB{sql: sdb, conns: conns}
	schema, err := db.migrate(ctx)
	if err != nil {
		sdb.Close()
		return nil, err
	}
	channel := channelName(schema)
	backend := entstore.Backend{
		Dialect:          dialect.Postgres,
		WriteTx:          writeTx(sdb),
		Read:             read,
		FormatError:      FormatError,
		ReleaseStatement: releaseStatement(channel),
	}
	store, err := entstore.New(ctx, sdb, sdb, backend)
	if err != nil {
		sdb.Close()
		return nil, err
	}
	db.store = newLockRepository(store, sdb, opts.LocalTime, backend.ReleaseStatement, releaseNotice(channel))
	if !opts.DisableGroupCommit {
		db.store.w = newBatches(db.store, false, context.Background())
	}
	db.wake = newListener(params.listenerConfig(cfg), channel)
	return db, nil
}

// Wakeups returns the server's notifications of releases by other
// processes, heard on a connection of their own opened at the first wait
// or release. Nil for a DB opened for inspection.
func (db *DB) Wakeups() application.Wakeups {
	if db.wake == nil {
		return nil
	}
	return db.wake
}

// DefaultConnectTimeout (seconds) keeps a host that never answers from
// blocking until the operating system gives up, minutes later.
const DefaultConnectTimeout = "10"

// WithConnectTimeout adds connect_timeout=DefaultConnectTimeout to a DSN,
// URL or key=value, that does not set one.
func WithConnectTimeout(dsn string) string {
	sep := " "
	switch {
	case strings.Contains(dsn, "connect_timeout="):
		return dsn
	case !strings.Contains(dsn, "://"):
	case strings.Contains(dsn, "?"):
		sep = "&"
	default:
		sep = "?"
	}
	return dsn + sep + "connect_timeout=" + DefaultConnectTimeout
}

// NewLockRepository returns the lock repository of db.
func NewLockRepository(db *DB) *LockRepository { return db.store }

// Close closes the pool. Call it after the last use of the store.
func (db *DB) Close() error { return db.CloseContext(context.Background()) }

// CloseContext is Close within ctx: the listener's farewell takes at most
// half of what remains of ctx (farewell), and a pool whose server does not
// answer is cut after closeGrace.
func (db *DB) CloseContext(ctx context.Context) error {
	db.wake.close(ctx)
	closed := make(chan error, 1)
	go func() { closed <- errors.Join(db.store.Close(), db.sql.Close()) }()
	var err error
	t := time.NewTimer(closeGrace) // real time: it paces I/O
	defer t.Stop()
	select {
	case err = <-closed:
	case <-t.C:
		// Each connection's graceful close (pgx deallocates its statements,
		// 5 s each) would wait for the silent server in turn.
		db.conns.cutAll()
		err = <-closed
	}
	return FormatError("close lock store", err)
}

const closeGrace = 2 * time.Second

// pool keeps a DB's network connections (the pool's, the listener's, pgx's
// cancel requests) from their dial on, so that Close can cut them, even
// mid-handshake; once cut, it dials no more.
type pool struct {
	mu   sync.Mutex
	open map[*poolConn]struct{}
	cut  bool
}

var errCut = errors.New("the lock store is closing, and its server did not answer")

// dial returns d, keeping each connection it opens.
func (p *pool) dial(d pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cut {
			c.Close()
			return nil, errCut
		}
		pc := &poolConn{Conn: c, p: p}
		p.open[pc] = struct{}{}
		return pc, nil
	}
}

// cutAll closes every connection kept: whatever waits on one fails at
// once, and later dials fail.
func (p *pool) cutAll() {
	p.mu.Lock()
	conns := make([]*poolConn, 0, len(p.open))
	for c := range p.open {
		conns = append(conns, c)
	}
	p.cut = true
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// heardFrom refuses a pooled connection whose server spoke while it sat
// idle (a terminated backend's farewell), before anything is sent on it:
// the driver pings only past a second idle. It peeks once pgx's own
// background read has ended (SyncConn), which the peek would otherwise
// wait behind.
func heardFrom(ctx context.Context, conn *pgx.Conn) error {
	if err := conn.PgConn().SyncConn(ctx); err != nil {
		return driver.ErrBadConn
	}
	c := conn.PgConn().Conn()
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	if pc, ok := c.(*poolConn); ok && pc.spoke() {
		return driver.ErrBadConn
	}
	return nil
}

// poolConn is a connection of a pool, which forgets it when it closes.
type poolConn struct {
	net.Conn
	p *pool
}

func (c *poolConn) Close() error {
	c.p.mu.Lock()
	delete(c.p.open, c)
	c.p.mu.Unlock()
	return c.Conn.Close()
}

// lockResource takes the advisory lock of ref for the rest of tx.
func lockResource(ctx context.Context, tx *sql.Tx, ref domain.ResourceRef) error {
	_, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", resourceKey(ref))
	return err
}

// resourceKey is the key of ref's advisory lock, taken by every write that
// decides on a read: a 64-bit hash, so colliding resources share a queue,
// never a row.
func resourceKey(ref domain.ResourceRef) int64 {
	h := fnv.New64a()
	h.Write([]byte(ref.Type))
	h.Write([]byte{0})
	h.Write([]byte(ref.ID))
	return int64(h.Sum64())
}

// read runs fn again when its connection ended under it: a read changes
// nothing, and another connection may answer.
func read(ctx context.Context, fn func(context.Context) error) error {
	return entstore.Retry(ctx, readAttempts, sessionEnded, fn)
}

// sessionEnded reports a failure of the statement's connection rather than
// of the server: known bad, lost without a word, or its session ended
// (admin_shutdown, crash_shutdown), even while connecting. A server that
// cannot be reached at all is not tried again.
func sessionEnded(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P01" || pgErr.Code == "57P02"
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return false
	}
	return connectionLost(err) || pgconn.SafeToRetry(err)
}

// writeTx is the store's Backend.WriteTx: a single statement alone, and
// several in a transaction pinned at READ COMMITTED, each through write.
func writeTx(db *sql.DB) func(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
	committed := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	return func(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
		if kind != entstore.Statements {
			return write(ctx, func(ctx context.Context) error { return body(ctx, nil) })
		}
		return write(ctx, func(ctx context.Context) error { return entstore.RunTx(ctx, db, committed, body) })
	}
}

// write runs fn again, with jittered backoff, when PostgreSQL aborted it
// to resolve a serialization failure or deadlock (retryable).
func write(ctx context.Context, fn func(context.Context) error) error {
	return entstore.Retry(ctx, writeAttempts, retryable, fn)
}
