package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"entgo.io/ent/dialect"
	"github.com/jackc/pgx/v5"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// MigrationName is the name of the migration that creates the locks table, the same as SQLite's.
const MigrationName = "m4_001_concurrency_locks"

// OpenReadOnly connects for diagnostics that change nothing: no migration,
// no prepared statement, every connection checked read-only; writes through
// the store fail with a StoreReadOnly error.
// Errors: a *domain.StoreError; StoreUnreachable when the server, the
// database or the login fails, or (matching ErrTransactionPooling) for a
// pooler that shares server sessions.
func OpenReadOnly(ctx context.Context, dsn string, opts Options) (*DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, storeError("inspect lock store", domain.StoreUnreachable, redacted{err})
	}
	op := "inspect lock store " + target(cfg)
	// The server applies a startup parameter after the DSN's "options".
	cfg.RuntimeParams["default_transaction_read_only"] = "on"
	sdb, conns, params := openPool(cfg, opts.MaxConns, 2, assertReadOnly)
	if err := read(ctx, func(ctx context.Context) error { return params.open(ctx, op, sdb, cfg) }); err != nil {
		sdb.Close()
		return nil, FormatError(op, err)
	}
	db := &DB{sql: sdb, conns: conns}
	db.store = newLockRepository(entstore.NewReadOnly(ctx, sdb, entstore.Backend{Dialect: dialect.Postgres, FormatError: FormatError, Read: read}), sdb, false, nil, nil)
	return db, nil
}

var errWritable = errors.New("the server did not make the connection read-only (default_transaction_read_only); " +
	"connect to the server directly rather than through a pooler that drops startup parameters")

// assertReadOnly refuses a connection that could write, preparing nothing.
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
	// Schema is the current schema, where the migrations create the locks
	// table; empty when the search_path names none that exists and is usable.
	Schema           string
	MigrationApplied bool // goose records MigrationName as applied in Schema
	LocksTable       bool // a table named locks exists in Schema
	SearchPath, User string
}

// Schema reports whether MigrationName has been applied and the locks table
// exists in the current schema, without goose (which would create its table).
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

// schema is Schema's reading, once, with the driver's errors as they are.
func (db *DB) schema(ctx context.Context) (st SchemaState, err error) {
	var (
		schema       *string
		ours, legacy bool
	)
	err = db.sql.QueryRowContext(ctx, `SELECT current_schema(), current_setting('search_path'), current_user,
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($2)) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.' || quote_ident($3)) IS NOT NULL`,
		entlock.Table, entstore.VersionTable, entstore.LegacyVersionTable).Scan(&schema, &st.SearchPath, &st.User, &st.LocksTable, &ours, &legacy)
	if err != nil {
		return st, err
	}
	if schema != nil {
		st.Schema = *schema
	}
	if schema == nil || !(ours || legacy) {
		return st, nil
	}
	// Ours or, in a schema only older versions of the module opened, goose's.
	versions := entstore.VersionTable
	if !ours {
		versions = entstore.LegacyVersionTable
	}
	version, err := entstore.MigrationVersion(migrationFiles, MigrationName)
	if err != nil {
		return st, &domain.StoreError{Op: "read schema", Err: err}
	}
	table := pgx.Identifier{st.Schema, versions}.Sanitize()
	err = db.sql.QueryRowContext(ctx, "SELECT is_applied FROM "+table+
		" WHERE version_id = $1 ORDER BY id DESC LIMIT 1", version).Scan(&st.MigrationApplied)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return st, err
}

// CheckWritable reports whether the service could write the lock store
// that dsn names (no standby, no read-only default, the table's rights),
// asking on a connection of its own and writing nothing.
// Errors: a *domain.StoreError of kind StoreReadOnly saying what does not
// allow writing, or StoreUnreachable when the server cannot be reached.
func CheckWritable(ctx context.Context, dsn string) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return storeError("check lock store", domain.StoreUnreachable, redacted{err})
	}
	op := "check lock store " + target(cfg)
	return read(ctx, func(ctx context.Context) error { // only reads: again on a new connection
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
		// Outside a transaction, transaction_read_only is the session's default.
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
	})
}

// target names cfg's database for messages, without the password.
func target(cfg *pgx.ConnConfig) string {
	s := fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	if sp := cfg.RuntimeParams["search_path"]; sp != "" {
		s += " (search_path " + sp + ")"
	}
	return s
}
