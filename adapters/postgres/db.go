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
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// writeAttempts bounds how often a write that failed with a serialization
// failure or a deadlock is tried in all.
const writeAttempts = 4

// DB is an open lock store on PostgreSQL. It is safe for concurrent use.
type DB struct {
	sql   *sql.DB
	conns *pool // the pool's connections, to cut when the server is silent
	store *LockRepository
	// wake carries wake-ups to and from the other processes on the store;
	// nil when opened for inspection.
	wake *listener
}

// Options tune Open. The zero value is the recommended setting.
type Options struct {
	// MaxConns bounds the connections of the pool; zero means 10.
	MaxConns int
	// LocalTime decides expiry on the service's clock alone, for a
	// service whose clock is not an estimate of the server's time (a
	// test's mock clock that moves ahead of it). By default a lock
	// changes hands, and is purged, only once it has expired on the
	// server's own clock too: an estimate (ServerClock) can run ahead of
	// the server, over a link slower one way than the other.
	LocalTime bool
	// DisableGroupCommit runs every acquire, renewal and release as a
	// statement of its own. By default those that arrive while others of
	// their kind are in flight go out together, in one statement and one
	// commit (batch.go).
	DisableGroupCommit bool
}

// Open connects to the database that dsn names (a postgres:// URL or a
// key=value string, as pgx accepts), applies the pending migrations under
// a session lock, so that processes starting together apply them once,
// and returns the store. It works through a connection pooler in session
// mode, and refuses one in transaction or statement mode (pooler.go).
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
	// The store's decisions rely on READ COMMITTED: a statement sees what
	// committed before it, and a transaction that waited on a resource's
	// advisory lock sees the row its predecessor left. At REPEATABLE READ
	// contention would surface as unique violations, at SERIALIZABLE as
	// serialization failures, rather than as conflicts. A startup
	// parameter overrides the server's, the database's and the role's
	// defaults (and the DSN's "options"), so that it holds for statements
	// outside any transaction too; writeTx pins the transactions
	// themselves.
	cfg.RuntimeParams["default_transaction_isolation"] = "read committed"
	// The store's statements are prepared once per connection (pgx's
	// statement cache) and their plans do not depend on their values: each
	// finds its rows through an index, whatever their number (the batch
	// statements of group commit look each member up by the unique index).
	// A custom plan per execution would only cost the planner's time, which
	// for a batch's statement is about what its execution costs.
	if _, set := cfg.RuntimeParams["plan_cache_mode"]; !set {
		cfg.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	// The lock table is small and churns: every cycle inserts a row and
	// deletes it, so between two visits of autovacuum most of its pages
	// hold dead rows that its statistics do not count, and a new table has
	// none. The planner then takes a scan of it for cheap, and a scan reads
	// every row, dead or alive, at every execution: a batch's DELETE, which
	// it joined by hashing a scan of the table, cost 13 % of the server's
	// CPU at 32 callers. Every statement of the store can find its rows
	// through an index; without a scan to choose, the planner does.
	if _, set := cfg.RuntimeParams["enable_seqscan"]; !set {
		cfg.RuntimeParams["enable_seqscan"] = "off"
	}
	conns := newPool()
	cfg.DialFunc = conns.dial(cfg.DialFunc)
	// A pooler may refuse these parameters at startup; they then go by
	// set_config, and a pooler that shares sessions is refused (pooler.go).
	params := newSessionParams(cfg)
	sdb := stdlib.OpenDB(*cfg, append(params.connectOptions(nil), stdlib.OptionResetSession(heardFrom))...)
	if opts.MaxConns <= 0 {
		opts.MaxConns = 10
	}
	sdb.SetMaxOpenConns(opts.MaxConns)
	sdb.SetMaxIdleConns(opts.MaxConns)
	sdb.SetConnMaxIdleTime(5 * time.Minute)
	if err := params.open(ctx, op, sdb, cfg); err != nil {
		sdb.Close()
		return nil, entstore.Explain(ctx, err, op, FormatError)
	}
	db := &DB{sql: sdb, conns: conns}
	if err := db.migrate(ctx); err != nil {
		sdb.Close()
		return nil, err
	}
	schema, err := db.currentSchema(ctx, op)
	if err != nil {
		sdb.Close()
		return nil, err
	}
	channel := channelName(schema)
	backend := entstore.Backend{
		Dialect:     dialect.Postgres,
		WriteTx:     writeTx(sdb),
		Read:        read,
		FormatError: FormatError,
		// Releases notify inside their statement (wake.go), so Released
		// stays nil.
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

// Wakeups returns what lets a waiter of this process sleep until a holder
// in another process (of this host or another) releases its lock: the
// server's notifications, heard on a connection of their own, opened at
// the first wait or release. Nil for a DB opened for inspection.
func (db *DB) Wakeups() application.Wakeups {
	if db.wake == nil {
		return nil
	}
	return db.wake
}

// DefaultConnectTimeout bounds how long connecting may take when the DSN
// does not say: without it, a host that never answers blocks until the
// operating system gives up, minutes later.
const DefaultConnectTimeout = "10"

// WithConnectTimeout adds connect_timeout=DefaultConnectTimeout (seconds)
// to a DSN, URL or key=value, that does not set one.
func WithConnectTimeout(dsn string) string {
	if strings.Contains(dsn, "connect_timeout=") {
		return dsn
	}
	if !strings.Contains(dsn, "://") {
		return dsn + " connect_timeout=" + DefaultConnectTimeout
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "connect_timeout=" + DefaultConnectTimeout
}

// NewLockRepository returns the lock repository of db.
func NewLockRepository(db *DB) *LockRepository { return db.store }

// Close closes the pool. Call it after the last use of the store.
func (db *DB) Close() error { return db.CloseContext(context.Background()) }

// CloseContext is Close within the deadline of a caller that closes the
// store on its way out, such as a command with a deadline: the
// listener's farewell to the other processes (that this one watches
// nothing any more) takes at most half of what remains of ctx, instead
// of up to 3 s, and none once ctx has ended. The pool then closes as
// Close closes it: a server that does not answer is cut after 2 s.
func (db *DB) CloseContext(ctx context.Context) error {
	db.wake.close(ctx)
	closed := make(chan error, 1)
	go func() { closed <- errors.Join(db.store.Close(), db.sql.Close()) }()
	var err error
	t := time.NewTimer(closeGrace) // real time: it paces I/O, and the adapter has no clock of its own
	defer t.Stop()
	select {
	case err = <-closed:
	case <-t.C:
		// The server does not answer: each connection's graceful close
		// (pgx deallocates its prepared statements, with 5 s for each
		// to answer) would wait for it in turn. Cut them: every wait
		// then fails at once.
		db.conns.cutAll()
		err = <-closed
	}
	return FormatError("close lock store", err)
}

// closeGrace is how long Close lets the pool's connections close
// gracefully before it cuts them.
const closeGrace = 2 * time.Second

// pool keeps the network connections of a DB (its pool's, its
// listener's, and pgx's cancel requests), from their dial on, so that
// Close can cut them when their server does not answer: a connection
// still in its startup handshake is cut too, and once cut, the pool
// dials no more.
type pool struct {
	mu   sync.Mutex
	open map[*poolConn]struct{}
	cut  bool
}

func newPool() *pool { return &pool{open: make(map[*poolConn]struct{})} }

// errCut is what a dial gets once Close has cut the connections.
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

// cutAll closes every connection kept (a net.Conn may be closed from any
// goroutine): whatever waits on one fails at once, and pgx then closes
// it; later dials fail.
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

// heardFrom refuses a connection taken from the pool whose server spoke
// while it sat idle (poolConn.spoke): database/sql then closes it and
// takes another, before anything is sent. The driver pings a connection
// idle for more than a second; a connection whose backend was terminated
// a moment ago (by an operator, a pooler, a shutdown) would otherwise
// fail the next statement with the server's farewell though nothing was
// written. The check is one system call that never waits, made once pgx
// has stopped its own reading of the socket (SyncConn): pgx reads in the
// background while a write of its is slow, and that read may still wait
// on the idle connection, holding the socket, which a peek would then
// wait behind for as long as the server says nothing. SyncConn pings to
// end such a read, within ctx; a connection that cannot be synced is
// refused as well.
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

// resourceKey is the key of ref's advisory lock, which every write of ref
// that decides on a read takes: Update's transactions, and the one-statement
// acquire. It is a 64-bit hash of the resource: two resources that collide
// only share a queue, never a lock row.
func resourceKey(ref domain.ResourceRef) int64 {
	h := fnv.New64a()
	h.Write([]byte(ref.Type))
	h.Write([]byte{0})
	h.Write([]byte(ref.ID))
	return int64(h.Sum64())
}

// readAttempts bounds how often a read whose connection ended under it
// is tried in all. database/sql itself tries up to three connections for
// each, when the driver knows them bad before it sends anything.
const readAttempts = 4

// read runs fn, and runs it again when its connection ended under it
// (sessionEnded): a read changes nothing, and another connection of the
// pool, or a new one, may answer.
func read(ctx context.Context, fn func(context.Context) error) error {
	return entstore.Retry(ctx, readAttempts, sessionEnded, fn)
}

// sessionEnded reports a failure of the connection a statement ran on
// rather than of the server: the driver knew the connection bad, it was
// lost without a word, or the server ended the session (an operator's
// pg_terminate_backend, a fast shutdown: admin_shutdown; a crash:
// crash_shutdown), even while the connection was being made. A server
// that cannot be reached at all fails the next try to connect, which is
// not run again.
func sessionEnded(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) { // a new connection's session too, ended while it started
		return pgErr.Code == "57P01" || pgErr.Code == "57P02"
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return false // no server answered
	}
	return connectionLost(err) || pgconn.SafeToRetry(err)
}

// writeTx is the store's Backend.WriteTx: a single statement alone, and
// several in a transaction at READ COMMITTED (so that a server's or
// role's default cannot change how contention surfaces), each through
// write.
func writeTx(db *sql.DB) func(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
	committed := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	return func(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
		if kind != entstore.Statements {
			return write(ctx, func(ctx context.Context) error { return body(ctx, nil) })
		}
		return write(ctx, func(ctx context.Context) error { return entstore.RunTx(ctx, db, committed, body) })
	}
}

// write runs fn, retrying it a bounded number of times with jittered
// backoff when PostgreSQL aborted it to resolve a serialization failure or
// a deadlock.
func write(ctx context.Context, fn func(context.Context) error) error {
	return entstore.Retry(ctx, writeAttempts, retryable, fn)
}
