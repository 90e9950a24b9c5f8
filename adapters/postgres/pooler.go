package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/cleveragents/locks/domain"
)

// Poolers: one in session mode works as the server does; one in
// transaction or statement mode is refused (sharedSessions). One that
// refuses or ignores run-time parameters at startup gets them by set_config.

// ErrTransactionPooling is the cause (in a *domain.StoreError of kind
// StoreUnreachable) of the refusal of a pooler that shares sessions.
var ErrTransactionPooling = errors.New("two connections of the lock store were served by the same server session: " +
	"the DSN names a connection pooler in transaction or statement mode (PgBouncer's pool_mode=transaction), " +
	"through which the store's wake-ups (LISTEN), session settings, migration lock and prepared statements do not work")

const poolingAdvice = "point the DSN at the PostgreSQL server itself, or at a pool in session mode (PgBouncer's pool_mode=session)"

// trackedParams are those that PgBouncer accepts at startup.
var trackedParams = map[string]bool{
	"application_name": true, "client_encoding": true, "datestyle": true,
	"timezone": true, "standard_conforming_strings": true,
}

type sessionParams struct {
	startup  map[string]string // those a pooler accepts at startup
	names    []string          // the others, by name and value, for set_config
	values   []string
	afterSet atomic.Bool // the pooler refused them at startup
}

func newSessionParams(cfg *pgx.ConnConfig) *sessionParams {
	p := &sessionParams{startup: make(map[string]string)}
	for k, v := range cfg.RuntimeParams {
		if trackedParams[strings.ToLower(k)] {
			p.startup[k] = v
			continue
		}
		p.names, p.values = append(p.names, k), append(p.values, v)
	}
	return p
}

// openPool opens a pool on cfg of maxConns (or defaultConns) connections, which run then once made.
func openPool(cfg *pgx.ConnConfig, maxConns, defaultConns int, then func(context.Context, *pgx.Conn) error) (*sql.DB, *pool, *sessionParams) {
	conns := &pool{open: make(map[*poolConn]struct{})}
	cfg.DialFunc = conns.dial(cfg.DialFunc)
	p := newSessionParams(cfg)
	sdb := stdlib.OpenDB(*cfg,
		// cfg is a shallow copy of the pool's: its map is replaced, never changed.
		stdlib.OptionBeforeConnect(func(_ context.Context, cfg *pgx.ConnConfig) error {
			if p.afterSet.Load() {
				cfg.RuntimeParams = p.startup
			}
			return nil
		}),
		stdlib.OptionAfterConnect(func(ctx context.Context, conn *pgx.Conn) error {
			if err := p.afterConnect(ctx, conn); err != nil || then == nil {
				return err
			}
			return then(ctx, conn)
		}),
		stdlib.OptionResetSession(heardFrom))
	if maxConns <= 0 {
		maxConns = defaultConns
	}
	sdb.SetMaxOpenConns(maxConns)
	sdb.SetMaxIdleConns(maxConns)
	return sdb, conns, p
}

// refused reports a pooler's refusal of a run-time parameter at startup,
// or one that ignored default_transaction_read_only (errWritable).
func (p *sessionParams) refused(err error) bool {
	if len(p.names) == 0 || p.afterSet.Load() {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.Is(err, errWritable) ||
		errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Message, "unsupported startup parameter")
}

// afterConnect sets the parameters left out of the startup message, on the
// simple protocol: a prepared statement could stay on a lent session.
func (p *sessionParams) afterConnect(ctx context.Context, conn *pgx.Conn) error {
	if !p.afterSet.Load() {
		return nil
	}
	_, err := conn.Exec(ctx, "SELECT count(set_config(k, v, false)) FROM unnest($1::text[], $2::text[]) AS p(k, v)",
		pgx.QueryExecModeSimpleProtocol, p.names, p.values)
	return err
}

func (p *sessionParams) paramsSet(ctx context.Context, conn *pgx.Conn) (set bool, err error) {
	err = conn.QueryRow(ctx, "SELECT bool_and(current_setting(k, true) IS NOT DISTINCT FROM v) FROM unnest($1::text[], $2::text[]) AS p(k, v)",
		pgx.QueryExecModeSimpleProtocol, p.names, p.values).Scan(&set)
	return set, err
}

// startupConfig is cfg with only trackedParams, setting nothing in a session a pooler might lend.
func (p *sessionParams) startupConfig(cfg *pgx.ConnConfig) *pgx.ConnConfig {
	c := cfg.Copy()
	c.RuntimeParams = maps.Clone(p.startup)
	return c
}

// listenerConfig is cfg for the listener, which needs no set_config.
func (p *sessionParams) listenerConfig(cfg *pgx.ConnConfig) *pgx.ConnConfig {
	if !p.afterSet.Load() {
		return cfg
	}
	return p.startupConfig(cfg)
}

func (p *sessionParams) connect(cfg *pgx.ConnConfig) func(context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, p.startupConfig(cfg)) }
}

// open checks that the server answers and that connections own their sessions, before any is set.
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

// connectOne makes one connection (CheckWritable) as open would a pool.
func (p *sessionParams) connectOne(ctx context.Context, op string, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil && !p.refused(err) {
		return nil, err
	}
	if err == nil {
		pid, err := backendPID(ctx, conn)
		if err == nil && pid == conn.PgConn().PID() {
			return conn, nil // the server itself
		}
		set := len(p.names) == 0 // a pooler: probed as open probes it, even with nothing to set
		if err == nil && !set {
			set, err = p.paramsSet(ctx, conn)
		}
		if err == nil {
			err = refusePooling(ctx, op, p.connect(cfg))
		}
		if err != nil {
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

// behindPooler reports whether sdb's backend PID differs from the one
// announced at startup, and whether the pooler ignored parameters
// (ignore_startup_parameters), closing that connection.
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
		set, err := p.paramsSet(ctx, conn)
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

// sharedSessions reports whether connect's connections may share a
// session: A reads its backend PID twice, B in a transaction, then A
// again, which catches round-robin and most-recently-used poolers; one it
// fools fails later on a prepared statement (sessionSwapped).
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
		return true, nil // not asking A again: it could wait for B's session for ever
	}
	again, err := backendPID(ctx, a)
	return again != first, err
}

// backendPID returns the PID of the session running conn's next statement.
func backendPID(ctx context.Context, conn *pgx.Conn) (uint32, error) {
	var pid uint32
	err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return pid, err
}

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
