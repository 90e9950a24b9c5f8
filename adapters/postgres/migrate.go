package postgres

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
)

//go:embed migrations/*.sql
var embedded embed.FS

var migrationFiles, _ = fs.Sub(embedded, "migrations") // fails only for an invalid path

// migrate applies the pending migrations in the current schema, which it
// returns, under goose's session lock. Names are qualified: goose's lookup
// of an unqualified table matches one in any schema.
func (db *DB) migrate(ctx context.Context) (string, error) {
	const op = "migrate lock store"
	schema, err := db.currentSchema(ctx, op)
	if err != nil {
		return "", err
	}
	tables := entstore.VersionTables{
		Dialect: database.DialectPostgres,
		Ours:    pgx.Identifier{schema, entstore.VersionTable}.Sanitize(),
		Legacy:  pgx.Identifier{schema, entstore.LegacyVersionTable}.Sanitize(),
		Exists: func(ctx context.Context, db database.DBTxConn, name string) (bool, error) {
			return tableExists(ctx, db, schema, name)
		},
	}
	if err := db.adoptHistory(ctx, tables); err != nil {
		return "", FormatError(op, err)
	}
	store, err := database.NewStore(database.DialectPostgres, tables.Ours)
	if err != nil {
		return "", &domain.StoreError{Op: op, Err: err}
	}
	// Poll every second, for up to a minute, while another process migrates.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 60))
	if err != nil {
		return "", &domain.StoreError{Op: op, Err: err}
	}
	p, err := goose.NewProvider(goose.DialectCustom, db.sql, migrationFiles,
		goose.WithStore(versionStore{Store: store, schema: schema}), goose.WithSessionLocker(locker))
	if err != nil {
		return "", &domain.StoreError{Op: op, Err: err}
	}
	if _, err := p.Up(ctx); err != nil {
		return "", FormatError(op, err)
	}
	return schema, nil
}

// currentSchema returns the schema the migrations create their tables in:
// the first of the search_path that exists and the user may use.
func (db *DB) currentSchema(ctx context.Context, op string) (string, error) {
	var (
		schema     *string
		searchPath string
		user       string
	)
	err := db.sql.QueryRowContext(ctx, "SELECT current_schema(), current_setting('search_path'), current_user").
		Scan(&schema, &searchPath, &user)
	if err != nil {
		return "", FormatError(op, err)
	}
	if schema == nil {
		return "", &domain.StoreError{Op: op, Kind: domain.StoreSchema,
			Err: fmt.Errorf("the search_path (%s) names no schema that exists and that user %q may use", searchPath, user),
			Advice: "create the schema, or set search_path (in the URL, or for the user or the database) " +
				"to a schema that exists, and grant the user USAGE and CREATE on it"}
	}
	return *schema, nil
}

// adoptHistory adopts, once, an older module's history (entstore.AdoptHistory)
// holding goose's migration lock, so never while another process migrates.
func (db *DB) adoptHistory(ctx context.Context, tables entstore.VersionTables) (err error) {
	if ok, err := tables.Exists(ctx, db.sql, entstore.VersionTable); err != nil || ok {
		return err
	}
	tx, err := db.sql.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	// Wait no longer than goose's locker does for another migration.
	if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '60s'"); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lock.DefaultLockID); err != nil {
		return err
	}
	if _, err := entstore.AdoptHistory(ctx, tx, tables, migrationFiles); err != nil {
		return err
	}
	return tx.Commit()
}

// versionStore is goose's store of a schema-qualified table, looked for there only.
type versionStore struct {
	database.Store
	schema string
}

func (s versionStore) TableExists(ctx context.Context, db database.DBTxConn) (bool, error) {
	return tableExists(ctx, db, s.schema, entstore.VersionTable)
}

func tableExists(ctx context.Context, db database.DBTxConn, schema, name string) (bool, error) {
	var ok bool
	err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = $2)",
		schema, name).Scan(&ok)
	return ok, err
}
