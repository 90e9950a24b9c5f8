package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// This file serves diagnostics: a look at a lock database that changes
// nothing, not even by accident. Open would create a missing file, apply
// migrations and switch the journal to WAL; OpenReadOnly does none of that.

// sqliteMagic is how every SQLite database file begins.
const sqliteMagic = "SQLite format 3\x00"

// errNotDatabase reports a file that SQLite would refuse as a database.
var errNotDatabase = errors.New("the file does not begin with the SQLite header")

// OpenReadOnly opens the existing database at pathOrURI for reading only.
// It never creates the file, never applies migrations, and creates no file
// beside it: writes through the returned DB fail with a StoreReadOnly error.
//
// SQLite opens a WAL database read-only by creating its -wal and -shm files
// when they are missing, and leaves them behind, owned by whoever ran the
// inspection (a root-owned -shm locks the application out). When they are
// missing, no connection is open and the last one checkpointed everything
// into the file, so the file is opened as immutable, which reads it without
// them. When a -wal file exists, other processes may have commits in it that
// only it holds, so the database is read through it.
//
// Errors: a *domain.StoreError: StoreUnreachable wrapping fs.ErrNotExist
// when the file does not exist, StoreCorrupt when it is not a database.
func OpenReadOnly(ctx context.Context, pathOrURI string, opts Options) (*DB, error) {
	dsn, err := DSN(pathOrURI, opts.BusyTimeout)
	if err != nil {
		return nil, &domain.StoreError{Op: "inspect lock store", Kind: domain.StoreUnreachable, Err: err}
	}
	path := filePath(dsn)
	op := "inspect lock store " + path
	if path == "" {
		return nil, &domain.StoreError{Op: "inspect lock store", Kind: domain.StoreUnreachable,
			Err: errors.New("an in-memory database has nothing to inspect")}
	}
	wal, err := readHeader(path)
	if errors.Is(err, errNotDatabase) {
		return nil, &domain.StoreError{Op: op, Kind: domain.StoreCorrupt, Err: err}
	}
	if err != nil {
		return nil, FormatError(op, err)
	}
	_, walErr := os.Lstat(path + "-wal")
	immutable := wal && errors.Is(walErr, fs.ErrNotExist)
	sdb, err := sql.Open("sqlite", readOnlyDSN(dsn, immutable))
	if err != nil {
		return nil, FormatError(op, err)
	}
	// Reading the catalogue makes SQLite parse the file now, so that a
	// damaged one is reported here rather than by the first query.
	var n int
	if err := sdb.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master").Scan(&n); err != nil {
		sdb.Close()
		return nil, FormatError(op, err)
	}
	db := &DB{sql: sdb, writer: make(chan struct{}, 1), path: path}
	db.store = entstore.NewReadOnly(sdb, db.backend())
	// No statements are prepared: the locks table may be missing, which is
	// for the schema check to report, and reads fall back to plain queries.
	return db, nil
}

// readHeader reports whether the file at path is a database in WAL mode.
// An empty file is a valid, empty database to SQLite; any other file must
// begin with SQLite's header, whose bytes 18 and 19 are 2 in WAL mode.
func readHeader(path string) (wal bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var h [100]byte
	n, err := io.ReadFull(f, h[:])
	switch {
	case n == 0 && err == io.EOF:
		return false, nil
	case err != nil && err != io.ErrUnexpectedEOF:
		return false, err
	case n < len(h) || string(h[:len(sqliteMagic)]) != sqliteMagic:
		return false, errNotDatabase
	}
	return h[18] == 2 && h[19] == 2, nil
}

// readOnlyDSN turns a DSN made by DSN into one that cannot write: the
// settings that would change the file are dropped, and the connection is
// opened read-only (and immutable when asked).
func readOnlyDSN(dsn string, immutable bool) string {
	base, query, _ := strings.Cut(dsn, "?")
	q, _ := url.ParseQuery(query) // DSN produced it, so it parses
	for _, k := range []string{"_journal_mode", "_journal", "_synchronous", "_sync", "_txlock",
		"_pragma", "_auto_vacuum", "_vacuum", "mode", "immutable"} {
		q.Del(k)
	}
	q.Set("mode", "ro")
	q.Set("_query_only", "1")
	if immutable {
		q.Set("immutable", "1")
	}
	return base + "?" + q.Encode()
}

// SchemaState is what Schema found in a database.
type SchemaState struct {
	// MigrationApplied: goose records MigrationName as applied.
	MigrationApplied bool
	// LocksTable: a table named locks exists, whoever created it.
	LocksTable bool
}

// Schema reports whether MigrationName has been applied and whether the
// locks table exists. Unlike MigrationApplied it only reads: goose would
// create its version table in a database that lacks one.
func (db *DB) Schema(ctx context.Context) (SchemaState, error) {
	const op = "read schema"
	var st SchemaState
	tables := map[string]bool{}
	rows, err := db.sql.QueryContext(ctx, "SELECT name FROM sqlite_master WHERE type = 'table'")
	if err != nil {
		return st, FormatError(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return st, FormatError(op, err)
		}
		tables[name] = true
	}
	if err := rows.Err(); err != nil {
		return st, FormatError(op, err)
	}
	st.LocksTable = tables[entlock.Table]
	// The module's own version table or, in a database that only versions
	// of the module older than that table have opened, goose's default one.
	table := entstore.VersionTable
	if !tables[table] {
		table = entstore.LegacyVersionTable
	}
	if !tables[table] {
		return st, nil
	}
	version, err := migrationVersion()
	if err != nil {
		return st, &domain.StoreError{Op: op, Err: err}
	}
	err = db.sql.QueryRowContext(ctx, "SELECT is_applied FROM "+table+
		" WHERE version_id = ? ORDER BY id DESC LIMIT 1", version).Scan(&st.MigrationApplied)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return st, FormatError(op, err)
	}
	return st, nil
}

// CheckWritable reports whether this process could write the database at
// pathOrURI: open the file for writing, and create and remove files in its
// directory, as SQLite does with the -wal and -shm files. It writes and
// creates nothing. Call it before opening the database: closing another
// descriptor of an open database file drops SQLite's locks on it.
//
// Errors: a *domain.StoreError of kind StoreReadOnly saying what is not
// writable, or StoreUnreachable when the file does not exist.
func CheckWritable(pathOrURI string) error {
	dsn, err := DSN(pathOrURI, 0)
	if err != nil {
		return &domain.StoreError{Op: "check lock store", Kind: domain.StoreUnreachable, Err: err}
	}
	path := filePath(dsn)
	if path == "" {
		return nil
	}
	op := "check lock store " + path
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return FormatError(op, err)
	}
	if err != nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly, Err: err}
	}
	if err := f.Close(); err != nil {
		return FormatError(op, err)
	}
	if err := dirWritable(filepath.Dir(path)); err != nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly, Err: err}
	}
	return nil
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
