package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/cleveragents/locks/domain"
)

// ErrForeignLocksTable matches the refusal of a database file that has a
// table named locks which the lock store's migration did not create: the
// table of another application, which the store must neither use nor
// build beside. The refusal is a *domain.StoreError of kind StoreSchema.
var ErrForeignLocksTable = errors.New("the file has a table named locks that the lock store did not create " +
	"(its migration " + MigrationName + " is not recorded)")

// foreignLocksAdvice is what to do about ErrForeignLocksTable.
const foreignLocksAdvice = "point the service at a lock database of its own (a path where no file exists yet creates one), " +
	"and leave this file to the application that made it; the file was left as it was"

// preflight decides, before anything writes to the file at path, whether
// Open may make it a lock store: switch its journal to WAL, create the
// version table and apply the migrations. Each of those writes the file,
// so each reason to refuse it must be found first, by reading only:
//
//   - a file that is not a SQLite database (StoreCorrupt);
//   - a table named locks without the record of the store's migration
//     (ErrForeignLocksTable): the migration would fail on it, after the
//     journal switch and the version table had changed the file.
//
// An empty or new file is the store's to make; a file with the store's
// migration recorded is a lock store; a file with other tables only is
// an application's database that the application shares with the store,
// which adds its tables beside the others.
//
// It reads through SQLite (SQLite reports a file that is not a
// database), with a connection that refuses every write
// (query_only) and leaves the journal mode alone; in WAL mode SQLite may
// create the -wal and -shm files to read, and removes them again when the
// connection closes, as it will for the store's own connections.
func preflight(ctx context.Context, op, dsn, path string) error {
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		return nil // new, or empty: SQLite's empty database
	}
	sdb, err := sql.Open("sqlite", readOnlyDSN(dsn, access{mode: "rw"}))
	if err != nil {
		return FormatError(op, err)
	}
	defer sdb.Close()
	sdb.SetMaxOpenConns(1)
	st, err := (&DB{sql: sdb}).Schema(ctx)
	if err != nil {
		return FormatError(op, err)
	}
	if st.LocksTable && !st.MigrationApplied {
		return &domain.StoreError{Op: op, Kind: domain.StoreSchema, Advice: foreignLocksAdvice,
			Err: fmt.Errorf("%s: %w", path, ErrForeignLocksTable)}
	}
	return nil
}
