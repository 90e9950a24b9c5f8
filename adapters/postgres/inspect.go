package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"entgo.io/ent/dialect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// This file serves diagnostics: a look at a lock database that changes
// nothing, not even by accident. Open applies the pending migrations, and
// goose creates its version table in a schema that lacks one; OpenReadOnly
// does neither, and its connections cannot write.

// MigrationName is the name of the migration that creates the locks table,
// the same as SQLite's.
const MigrationName = "m4_001_concurrency_locks"

// inspectConns bounds the connections of a DB opened for inspection.
const inspectConns = 2

// OpenReadOnly connects to the database that dsn names for reading only.
// It applies no migration and prepares no statement (the locks table may
// be missing: that is for Schema to report). Every connection it opens
// has default_transaction_read_only set, whatever the DSN says, and is
// checked to be read-only before use, so that no statement through it can
// write; writes through the returned store fail with a StoreReadOnly error
// before they reach the server.
//
// Errors: a *domain.StoreError; StoreUnreachable when the server cannot be
// reached, the database does not exist or the login is refused, or
// (matching ErrTransactionPooling) the DSN names a pooler that shares
// server sessions between connections.
func OpenReadOnly(ctx context.Context, dsn string, opts Options) (*DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, storeError("inspect lock store", domain.StoreUnreachable, redacted{err})
	}
	op := "inspect lock store " + target(cfg)
	// A run-time parameter of the startup message: the server applies it
	// after the DSN's "options", so neither can turn it off.
	cfg.RuntimeParams["default_transaction_read_only"] = "on"
	conns := newPool()
	cfg.DialFunc = conns.dial(cfg.DialFunc)
	// Through a pooler that refuses it at startup, the parameter goes by
	// set_config, as Open's do, and assertReadOnly checks it all the same.
	params := newSessionParams(cfg)
	sdb := stdlib.OpenDB(*cfg, append(params.connectOptions(assertReadOnly), stdlib.OptionResetSession(heardFrom))...)
	if opts.MaxConns <= 0 {
		opts.MaxConns = inspectConns
	}
	sdb.SetMaxOpenConns(opts.MaxConns)
	sdb.SetMaxIdleConns(opts.MaxConns)
	if err := read(ctx, func(ctx context.Context) error { return params.open(ctx, op, sdb, cfg) }); err != nil {
		sdb.Close()
		return nil, FormatError(op, err)
	}
	db := &DB{sql: sdb, conns: conns}
	db.store = newLockRepository(entstore.NewReadOnly(sdb, entstore.Backend{Dialect: dialect.Postgres, FormatError: FormatError, Read: read}), sdb, false, nil, nil)
	return db, nil
}

// errWritable reports a connection for inspection that could write: a
// connection pooler that drops the startup parameters, say.
var errWritable = errors.New("the server did not make the connection read-only (default_transaction_read_only); " +
	"connect to the server directly rather than through a pooler that drops startup parameters")

// assertReadOnly refuses a new connection whose transactions could write.
// It prepares nothing (the simple protocol): through a pooler that lends
// sessions per transaction, a prepared statement would stay behind on a
// session this connection may not get again.
func assertReadOnly(ctx context.Context, conn *pgx.Conn) error {
	var ro string
	if err := conn.QueryRow(ctx, "SELECT current_setting('transaction_read_only')", pgx.QueryExecModeSimpleProtocol).Scan(&ro); err != nil {
		return err
	}
	if ro != "on" {
		return errWritable
	}
	return nil
}

// SchemaState is what Schema found in a database.
type SchemaState struct {
	// Schema is the current schema: the first schema of the search_path
	// that exists and this user may use, where the migrations create the
	// locks table. Empty when there is none.
	Schema string
	// MigrationApplied: goose records MigrationName as applied in Schema.
	MigrationApplied bool
	// LocksTable: a table named locks exists in Schema, whoever created it.
	LocksTable bool
	// SearchPath is the session's search_path, for a message that says
	// why Schema is empty; User is the user the session runs as.
	SearchPath, User string
}

// Schema reports whether MigrationName has been applied and whether the
// locks table exists, in the current schema, as goose and the store see
// them. It only reads: goose would create its version table in a schema
// that lacks one.
func (db *DB) Schema(ctx context.Context) (SchemaState, error) {
	var st SchemaState
	err := read(ctx, func(ctx context.Context) (err error) {
		st, err = db.schema(ctx)
		return err
	})
	var se *domain.StoreError
	if err != nil && !errors.As(err, &se) {
		err = FormatError("read schema", err)
	}
	return st, err
}

// schema is Schema's reading, once; it returns the driver's errors as
// they are.
func (db *DB) schema(ctx context.Context) (SchemaState, error) {
	const op = "read schema"
	var (
		st           SchemaState
		schema       *string
		ours, legacy bool
	)
	err := db.sql.QueryRowContext(ctx, `SELECT current_schema(), current_setting('search_path'), current_user,
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($2)) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($3)) IS NOT NULL`,
		entlock.Table, entstore.VersionTable, entstore.LegacyVersionTable).Scan(&schema, &st.SearchPath, &st.User, &st.LocksTable, &ours, &legacy)
	if err != nil {
		return st, err
	}
	// The module's own version table or, in a schema that only versions of
	// the module older than that table have opened, goose's default one.
	versions := entstore.VersionTable
	if !ours {
		versions = entstore.LegacyVersionTable
	}
	if schema == nil || !(ours || legacy) {
		if schema != nil {
			st.Schema = *schema
		}
		return st, nil
	}
	st.Schema = *schema
	version, err := migrationVersion()
	if err != nil {
		return st, &domain.StoreError{Op: op, Err: err}
	}
	table := pgx.Identifier{st.Schema, versions}.Sanitize()
	err = db.sql.QueryRowContext(ctx, "SELECT is_applied FROM "+table+
		" WHERE version_id = $1 ORDER BY id DESC LIMIT 1", version).Scan(&st.MigrationApplied)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return st, err
	}
	return st, nil
}

// migrationVersion returns the goose version of the embedded migration
// MigrationName.
func migrationVersion() (int64, error) {
	fsys, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return 0, err
	}
	return entstore.MigrationVersion(fsys, MigrationName)
}

// CheckWritable reports whether the service could write the lock store
// that dsn names: the server is not a standby, transactions are not
// read-only by default for this user and database, and the user may read
// and write the locks table (or, when it does not exist yet, create it in
// the current schema). It asks the server on a connection of its own, as
// the service would connect, and only calls functions that read; it writes
// and creates nothing.
//
// Errors: a *domain.StoreError of kind StoreReadOnly saying what does not
// allow writing, or StoreUnreachable when the server cannot be reached.
func CheckWritable(ctx context.Context, dsn string) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return storeError("check lock store", domain.StoreUnreachable, redacted{err})
	}
	op := "check lock store " + target(cfg)
	// Only reads: run again on a new connection if the session ends.
	return read(ctx, func(ctx context.Context) error { return checkWritable(ctx, cfg, op) })
}

// checkWritable is CheckWritable's check, once.
func checkWritable(ctx context.Context, cfg *pgx.ConnConfig, op string) error {
	conn, err := newSessionParams(cfg).connectOne(ctx, op, cfg)
	if err != nil {
		return FormatError(op, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	readOnly := func(format string, args ...any) error {
		return storeError(op, domain.StoreReadOnly, fmt.Errorf(format, args...))
	}

	var (
		recovery   bool
		txReadOnly string
		user       string
		schema     *string
		table      *uint32 // the oid of the locks table
	)
	// Outside any explicit transaction, so that transaction_read_only is
	// the session's default.
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only'), current_user, current_schema(),
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1))::oid`, entlock.Table).
		Scan(&recovery, &txReadOnly, &user, &schema, &table)
	if err != nil {
		return FormatError(op, err)
	}
	switch {
	case recovery:
		return readOnly("the server is a standby, in recovery: connect to the primary")
	case txReadOnly == "on":
		return readOnly("transactions are read-only by default for user %q on this database "+
			"(default_transaction_read_only is on, set for the server, the database, the user or in the DSN)", user)
	case schema == nil:
		return readOnly("the search_path names no schema that exists and that user %q may use: "+
			"the migrations would have nowhere to create the locks table", user)
	case table == nil:
		var create bool
		if err := conn.QueryRow(ctx, "SELECT has_schema_privilege(current_schema(), 'CREATE')").Scan(&create); err != nil {
			return FormatError(op, err)
		}
		if !create {
			return readOnly("there is no locks table in schema %q, and user %q may not create one there, as the migrations must", *schema, user)
		}
		return nil
	}
	var missing []string
	for _, priv := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT has_table_privilege($1::oid, $2)", *table, priv).Scan(&ok); err != nil {
			return FormatError(op, err)
		}
		if !ok {
			missing = append(missing, priv)
		}
	}
	if len(missing) > 0 {
		return readOnly("user %q lacks the %s privilege on table %s.%s: grant it, or connect as the user the service runs as",
			user, strings.Join(missing, ", "), pgx.Identifier{*schema}.Sanitize(), entlock.Table)
	}
	return nil
}

// target names the database that cfg connects to, for messages: user,
// first host, database and search_path, and never the password.
func target(cfg *pgx.ConnConfig) string {
	s := fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	if sp := cfg.RuntimeParams["search_path"]; sp != "" {
		s += " (search_path " + sp + ")"
	}
	return s
}
