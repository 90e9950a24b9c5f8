package sqlite

import (
	"context"
	"io/fs"

	"github.com/pressly/goose/v3/database"

	"github.com/cleveragents/locks/adapters/entstore"
)

// versionTables names the version tables of a SQLite database to
// entstore.AdoptHistory, unqualified (one schema per file).
var versionTables = entstore.VersionTables{
	Dialect: database.DialectSQLite3,
	Ours:    entstore.VersionTable,
	Legacy:  entstore.LegacyVersionTable,
	Exists: func(ctx context.Context, db database.DBTxConn, name string) (bool, error) {
		var n int
		err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", name).Scan(&n)
		return n > 0, err
	},
}

// adoptHistory adopts, once, the history of a database that an earlier
// version of the module migrated (entstore.AdoptHistory), in one
// transaction that BEGIN IMMEDIATE keeps every other process out of.
func (db *DB) adoptHistory(ctx context.Context, fsys fs.FS) error {
	// Once the module's table exists, Open needs no write lock here.
	if ok, err := versionTables.Exists(ctx, db.sql, entstore.VersionTable); err != nil || ok {
		return err
	}
	return db.withWriter(ctx, func() (err error) {
		tx, err := db.wsql.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() {
			if err != nil {
				tx.Rollback()
			}
		}()
		if _, err := entstore.AdoptHistory(ctx, tx, versionTables, fsys); err != nil {
			return err
		}
		return tx.Commit()
	})
}
