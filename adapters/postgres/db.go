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

const writeAttempts, readAttempts = 4, 4

// DB is an open lock store on PostgreSQL. It is safe for concurrent use.
type DB struct {
	sql   *sql.DB
	conns *pool // the pool's connections, to cut when the server is silent
	store *LockRepository
	wake  *listener   // nil when opened for inspection
	claim *ownerClaim // Options.Owner's, while open; nil if none
}

// Options tune Open. The zero value is the recommended setting.
type Options struct {
	MaxConns int // bounds the pool's connections; zero means 10
	// LocalTime decides expiry on the service's clock alone (a test's mock);
	// by default also on the server's, as an estimate (ServerClock) can run ahead.
	LocalTime          bool
	DisableGroupCommit bool // runs every acquire, renewal and release alone
	// Owner, when set, is claimed while the DB is open: Open refuses it
	// with a *domain.OwnerInUseError, before it migrates, while another
	// open DB of the database's schema, in any process, claims it.
	Owner string
}

// Open connects to the database that dsn (a URL or key=value string)
// names and applies the pending migrations.
// Errors: a *domain.StoreError whose kind names the cause; StoreUnreachable
// matching ErrTransactionPooling for a pooler that shares server sessions;
// *domain.OwnerInUseError for an Options.Owner another open DB claims.
func Open(ctx context.Context, dsn string, opts Options) (*DB, error) {
	op := "open lock store " + Redact(dsn)
	cfg, err := pgx.ParseConfig(WithConnectTimeout(dsn))
	if err != nil {
		return nil, storeError(op, domain.StoreUnreachable, errors.New(Redact(err.Error())))
	}
	// A transaction that waited on a resource's advisory lock must see the
	// row its predecessor left; a startup parameter overrides every default.
	cfg.RuntimeParams["default_transaction_isolation"] = "read committed"
	// Every statement has an index: a custom plan costs about a batch, and a
	// scan of the churning table reads all its dead rows.
	for k, v := range map[string]string{"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"} {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
	sdb, conns, params := openPool(cfg, opts.MaxConns, 10, nil)
	sdb.SetConnMaxIdleTime(5 * time.Minute)
	if err := params.open(ctx, op, sdb, cfg); err != nil {
		sdb.Close()
		return nil, entstore.Explain(ctx, err, op, FormatError)
	}
	db := &DB{sql: sdb, conns: conns}
	if opts.Owner != "" {
		schema, err := db.currentSchema(ctx, op)
		if err == nil {
			db.claim, err = claimOwner(ctx, op, params.listenerConfig(cfg), schema, opts.Owner, Redact(dsn))
		}
		if err != nil {
			sdb.Close()
			return nil, err
		}
	}
	schema, err := db.migrate(ctx)
	if err != nil {
		db.closeClaim()
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
		Replaced:         notifyReplaced(sdb, channel),
	}
	store, err := entstore.New(ctx, sdb, sdb, backend)
	if err != nil {
		db.closeClaim()
		sdb.Close()
		return nil, err
	}
	notice := func(typ, id string) string { return watchedOrNotify(channel, typ, id) }
	db.store = newLockRepository(store, sdb, opts.LocalTime, backend.ReleaseStatement, notice)
	db.store.replaced = backend.Replaced
	if !opts.DisableGroupCommit {
		db.store.w = newBatches(db.store, false, context.Background())
	}
	db.wake = newListener(params.listenerConfig(cfg), channel)
	return db, nil
}

// Wakeups returns the other processes' releases, heard through the
// server's notifications; nil for a DB opened for inspection.
func (db *DB) Wakeups() application.Wakeups {
	if db.wake == nil {
		return nil
	}
	return db.wake
}

// DefaultConnectTimeout (seconds) bounds connecting to a host that never answers.
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

// CloseContext is Close within ctx: the listener's farewell takes at most half of what remains of it.
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
		// Graceful closes (5 s each) would wait for a silent server in turn.
		db.conns.cutAll()
		err = <-closed
	}
	// Last: the owner id is free only once the store is done with it.
	db.closeClaim()
	return FormatError("close lock store", err)
}

// closeClaim ends the owner's claim, if any: a failure to say goodbye
// leaves the server to end the session when it sees the connection gone.
func (db *DB) closeClaim() {
	if db.claim == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
	defer cancel()
	_ = db.claim.close(ctx)
	db.claim = nil
}

const closeGrace = 2 * time.Second

// pool keeps a DB's network connections from their dial on, so that Close
// can cut them, even mid-handshake.
type pool struct {
	mu   sync.Mutex
	open map[*poolConn]struct{}
	cut  bool
}

var errCut = errors.New("the lock store is closing, and its server did not answer")

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

// cutAll closes every connection kept, and later dials fail.
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

// heardFrom refuses a pooled connection whose server spoke while it sat idle
// (a terminated backend's farewell): the driver pings only past a second
// idle. SyncConn ends pgx's background read, which the peek would wait behind.
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

func lockResource(ctx context.Context, tx *sql.Tx, ref domain.ResourceRef) error {
	_, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", resourceKey(ref))
	return err
}

// resourceKey is the key of ref's advisory lock: colliding resources share a queue, never a row.
func resourceKey(ref domain.ResourceRef) int64 {
	h := fnv.New64a()
	h.Write([]byte(ref.Type))
	h.Write([]byte{0})
	h.Write([]byte(ref.ID))
	return int64(h.Sum64())
}

// read runs fn again when its connection ended under it.
func read(ctx context.Context, fn func(context.Context) error) error {
	return entstore.Retry(ctx, readAttempts, sessionEnded, fn)
}

// sessionEnded reports a failure of the connection rather than of the
// server: known bad, lost, or its session ended, even while connecting.
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

// writeTx is the store's Backend.WriteTx: several statements in a transaction pinned at READ COMMITTED.
func writeTx(db *sql.DB) func(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
	committed := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	return func(ctx context.Context, kind entstore.WriteKind, body func(context.Context, *sql.Tx) error) error {
		if kind != entstore.Statements {
			return write(ctx, func(ctx context.Context) error { return body(ctx, nil) })
		}
		return write(ctx, func(ctx context.Context) error { return entstore.RunTx(ctx, db, committed, body) })
	}
}

// write runs fn again when it wrote nothing and may (retryable).
func write(ctx context.Context, fn func(context.Context) error) error {
	return entstore.Retry(ctx, writeAttempts, retryable, fn)
}
