package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/cleveragents/locks/domain"
)

// Connection poolers. The store works through a pooler in session mode
// (PgBouncer's pool_mode=session): each of its connections then has a
// server session of its own for as long as it lasts, as it has on the
// server directly. It cannot work through one in transaction or statement
// mode, which lends a server session to a client for one transaction (or
// statement) only: the wake-ups' LISTEN, the session settings below, the
// migrations' session lock and pgx's prepared statements all live in a
// session, and would be lost, or left behind for other clients. Open and
// OpenReadOnly refuse such a pooler (ErrTransactionPooling) when they can
// see it (sharedSessions).
//
// A pooler may also refuse, at a connection's startup, the run-time
// parameters it does not track (PgBouncer 1.18: "unsupported startup
// parameter"), which the store sends there (default_transaction_isolation,
// plan_cache_mode, ...), as may the DSN (search_path). When it does, the
// store sends those parameters with set_config once each connection is
// made instead (sessionParams): the same settings for the session, one
// round trip later.

// ErrTransactionPooling is the cause (in a *domain.StoreError of kind
// StoreUnreachable) of Open's and OpenReadOnly's refusal of a connection
// pooler that shares server sessions between its clients' connections.
var ErrTransactionPooling = errors.New("two connections of the lock store were served by the same server session: " +
	"the DSN names a connection pooler in transaction or statement mode (PgBouncer's pool_mode=transaction), " +
	"through which the store's wake-ups (LISTEN), session settings, migration lock and prepared statements do not work")

// poolingAdvice says what to do about ErrTransactionPooling.
const poolingAdvice = "point the DSN at the PostgreSQL server itself, or at a pool in session mode (PgBouncer's pool_mode=session)"

// trackedParams are the run-time parameters that PgBouncer accepts at a
// connection's startup (and pgx sends): every other goes by set_config
// once a pooler has refused one.
var trackedParams = map[string]bool{
	"application_name": true, "client_encoding": true, "datestyle": true,
	"timezone": true, "standard_conforming_strings": true,
}

// sessionParams carries a pool's run-time parameters to its connections:
// in the startup message, or, once a pooler refused one there, by
// set_config after the connection is made.
type sessionParams struct {
	all      map[string]string // every run-time parameter, as the config has them
	startup  map[string]string // those a pooler accepts at startup
	names    []string          // the others, by name and value, for set_config
	values   []string
	afterSet atomic.Bool // the pooler refused them at startup
}

func newSessionParams(cfg *pgx.ConnConfig) *sessionParams {
	p := &sessionParams{all: cfg.RuntimeParams, startup: make(map[string]string)}
	for k, v := range cfg.RuntimeParams {
		if trackedParams[strings.ToLower(k)] {
			p.startup[k] = v
			continue
		}
		p.names, p.values = append(p.names, k), append(p.values, v)
	}
	return p
}

// refused reports whether err is a pooler's refusal of a run-time
// parameter at startup, which set_config can carry instead, or an
// inspection's connection that is not read-only (errWritable): a pooler
// that ignored default_transaction_read_only at startup.
func (p *sessionParams) refused(err error) bool {
	if len(p.names) == 0 || p.afterSet.Load() {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.Is(err, errWritable) ||
		errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Message, "unsupported startup parameter")
}

// beforeConnect leaves out of the startup message the parameters that go
// by set_config. cfg is a shallow copy of the pool's: its map is replaced,
// never changed.
func (p *sessionParams) beforeConnect(_ context.Context, cfg *pgx.ConnConfig) error {
	if p.afterSet.Load() {
		cfg.RuntimeParams = p.startup
	}
	return nil
}

// afterConnect sets the parameters left out of the startup message, for
// the session. It runs on the simple protocol: a statement prepared
// through a pooler that shares sessions would be left on a session that
// this connection may not get again.
func (p *sessionParams) afterConnect(ctx context.Context, conn *pgx.Conn) error {
	if !p.afterSet.Load() {
		return nil
	}
	_, err := conn.Exec(ctx, "SELECT count(set_config(k, v, false)) FROM unnest($1::text[], $2::text[]) AS p(k, v)",
		pgx.QueryExecModeSimpleProtocol, p.names, p.values)
	return err
}

// listenerConfig is cfg as the wake-up listener connects with it: its
// own connection, made with pgx.ConnectConfig, which only LISTENs and
// NOTIFYs, and needs none of the parameters that go by set_config.
func (p *sessionParams) listenerConfig(cfg *pgx.ConnConfig) *pgx.ConnConfig {
	if !p.afterSet.Load() {
		return cfg
	}
	c := cfg.Copy()
	c.RuntimeParams = make(map[string]string, len(p.startup))
	for k, v := range p.startup {
		c.RuntimeParams[k] = v
	}
	return c
}

// connectOptions are the pool's hooks for p, after which then runs on
// each new connection.
func (p *sessionParams) connectOptions(then func(context.Context, *pgx.Conn) error) []stdlib.OptionOpenDB {
	return []stdlib.OptionOpenDB{
		stdlib.OptionBeforeConnect(p.beforeConnect),
		stdlib.OptionAfterConnect(func(ctx context.Context, conn *pgx.Conn) error {
			if err := p.afterConnect(ctx, conn); err != nil {
				return err
			}
			if then != nil {
				return then(ctx, conn)
			}
			return nil
		}),
	}
}

// connect makes a connection outside the pool, with the parameters that
// a pooler accepts at startup only: one that sets nothing in a session
// that a pooler might lend to others.
func (p *sessionParams) connect(cfg *pgx.ConnConfig) func(context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) {
		c := cfg.Copy()
		c.RuntimeParams = make(map[string]string, len(p.startup))
		for k, v := range p.startup {
			c.RuntimeParams[k] = v
		}
		return pgx.ConnectConfig(ctx, c)
	}
}

// open checks that the server answers on a connection of sdb, and that
// the connections have server sessions of their own, before the pool
// sets anything in a session: a setting made through a pooler that lends
// sessions would stay on the session, for its other clients. When a
// pooler refuses the parameters at startup, it probes the pooler (on
// connections that send none) and then sends them by set_config; when
// the pool's connection turns out to be a pooler's, it probes it too.
// op names the operation for errors.
func (p *sessionParams) open(ctx context.Context, op string, sdb *sql.DB, cfg *pgx.ConnConfig) error {
	err := sdb.PingContext(ctx)
	if err != nil && p.refused(err) {
		if err := refusePooling(ctx, op, p.connect(cfg)); err != nil {
			return err
		}
		p.afterSet.Store(true)
		err = sdb.PingContext(ctx)
	}
	if err != nil {
		return err
	}
	pooler, ignored, err := p.behindPooler(ctx, sdb)
	if err != nil {
		return FormatError(op, fmt.Errorf("checking for a connection pooler: %w", err))
	}
	if !pooler || p.afterSet.Load() {
		return nil
	}
	if err := refusePooling(ctx, op, p.connect(cfg)); err != nil {
		return err
	}
	if ignored {
		p.afterSet.Store(true)
	}
	return nil
}

// connectOne makes one connection outside any pool, for a check of its
// own (CheckWritable), as open would for a pool: with the parameters at
// startup, or, through a pooler that refuses or ignores them there, by
// set_config; a pooler that shares sessions is refused, before anything
// is set.
func (p *sessionParams) connectOne(ctx context.Context, op string, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil && !p.refused(err) {
		return nil, err
	}
	if err == nil {
		pid, err := backendPID(ctx, conn)
		if err != nil || pid == conn.PgConn().PID() || len(p.names) == 0 {
			return conn, err // the server itself, or nothing to set
		}
		var set bool
		err = conn.QueryRow(ctx, "SELECT bool_and(current_setting(k, true) IS NOT DISTINCT FROM v) FROM unnest($1::text[], $2::text[]) AS p(k, v)",
			pgx.QueryExecModeSimpleProtocol, p.names, p.values).Scan(&set)
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, err
		}
		if err := refusePooling(ctx, op, p.connect(cfg)); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, err
		}
		if set {
			return conn, nil
		}
		conn.Close(context.WithoutCancel(ctx)) // the pooler ignored them
	} else if err := refusePooling(ctx, op, p.connect(cfg)); err != nil {
		return nil, err
	}
	p.afterSet.Store(true)
	conn, err = p.connect(cfg)(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.afterConnect(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// behindPooler reports whether sdb's connections go through a pooler: a
// connection to the server itself has the backend process id that the
// server announced at its startup, one through a pooler the pooler's own.
// When it does, and the parameters went in the startup message, it also
// reports whether the pooler ignored some of them (PgBouncer's
// ignore_startup_parameters), and closes that connection, which lacks
// them.
func (p *sessionParams) behindPooler(ctx context.Context, sdb *sql.DB) (pooler, ignored bool, err error) {
	c, err := sdb.Conn(ctx)
	if err != nil {
		return false, false, err
	}
	defer c.Close()
	err = c.Raw(func(dc any) error {
		conn := dc.(*stdlib.Conn).Conn()
		pid, err := backendPID(ctx, conn)
		if err != nil {
			return err
		}
		pooler = pid != conn.PgConn().PID()
		if !pooler || p.afterSet.Load() || len(p.names) == 0 {
			return nil
		}
		var set bool
		err = conn.QueryRow(ctx, "SELECT bool_and(current_setting(k, true) IS NOT DISTINCT FROM v) FROM unnest($1::text[], $2::text[]) AS p(k, v)",
			pgx.QueryExecModeSimpleProtocol, p.names, p.values).Scan(&set)
		if err == nil && !set {
			ignored = true
			return driver.ErrBadConn // closes it: the pool makes the next one with set_config
		}
		return err
	})
	if ignored {
		err = nil
	}
	return pooler, ignored, err
}

// sharedSessions reports whether two connections made by connect may be
// served by one server session: a pooler in transaction or statement
// mode. A reads its session's process id twice; B, in a transaction,
// reads its own; A reads its own again. In session mode A keeps its
// session (its three readings agree) and B has another. A pooler that
// lends sessions per transaction gives A, the second time, the next idle
// session in turn (PgBouncer's server_round_robin, with two or more
// sessions idle), or the one it just let go (the most recently used,
// PgBouncer's default), which B is then given; or, when B got another, A
// gets a session other than its first the third time. B's transaction
// alone is not enough: in a round-robin pool of two, it holds the other
// session, and A gets its first one back. Both speak the simple
// protocol, which prepares nothing. A pool that these readings still
// fool fails the migrations with a prepared statement that the session
// lacks or already has, which FormatError reports as the pooler it is.
func sharedSessions(ctx context.Context, connect func(context.Context) (*pgx.Conn, error)) (bool, error) {
	a, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer a.Close(context.WithoutCancel(ctx))
	first, err := backendPID(ctx, a)
	if err != nil {
		return false, err
	}
	if next, err := backendPID(ctx, a); err != nil || next != first {
		return next != first, err
	}
	b, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer b.Close(context.WithoutCancel(ctx))
	tx, err := b.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	other, err := backendPID(ctx, tx.Conn())
	if err != nil {
		return false, err
	}
	if other == first {
		// Shared; A's next statement would wait for the session B holds
		// (for ever in a pool of one session), so it is not asked.
		return true, nil
	}
	again, err := backendPID(ctx, a)
	return again != first, err
}

// backendPID returns the process id of the server session that runs
// conn's next statement.
func backendPID(ctx context.Context, conn *pgx.Conn) (uint32, error) {
	var pid uint32
	err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return pid, err
}

// refusePooling returns the refusal of a pooler that shares sessions
// between the connections that connect makes, nil when they have
// sessions of their own, or the probe's failure.
func refusePooling(ctx context.Context, op string, connect func(context.Context) (*pgx.Conn, error)) error {
	shared, err := sharedSessions(ctx, connect)
	switch {
	case err != nil:
		return FormatError(op, fmt.Errorf("checking that the connections have server sessions of their own: %w", err))
	case shared:
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: ErrTransactionPooling, Advice: poolingAdvice}
	}
	return nil
}
