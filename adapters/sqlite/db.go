package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"entgo.io/ent/dialect"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationName is the name of the migration that creates the locks table.
const MigrationName = "m4_001_concurrency_locks"

// maxReaders bounds a DB's reading connections; writeAttempts the tries
// of a write that found the database busy.
const maxReaders, writeAttempts = 4, 4

// DB is an open lock store. It is safe for concurrent use.
type DB struct {
	sql         *sql.DB       // reads, in parallel beside a write (WAL)
	wsql        *sql.DB       // writes, over one connection; nil for a read-only handle
	writer      chan struct{} // the one writer while migrating; then commits
	commits     committer
	writers     *writerQueue // the writes of every process on the file
	checkpoints checkpointer
	wake        *wakeFile   // nil where wake-ups cannot cross processes
	claim       *ownerClaim // Options.Owner's, while open; nil if none
	path        string
	// file is the file as Open found it; every write checks abs still names it (checkFile).
	file  os.FileInfo
	abs   string
	store *LockRepository
}

// Options tune Open. The zero value is the recommended setting.
type Options struct {
	// BusyTimeout is how long a statement waits for another process's write lock; zero: DefaultBusyTimeout.
	BusyTimeout time.Duration
	// Owner, when set, is claimed while the DB is open (on Linux): Open
	// refuses it with a *domain.OwnerInUseError, before it writes
	// anything, while another open DB of the file, in any process, claims it.
	Owner string
}

// Open opens (creating it if needed) the database at pathOrURI, applies the
// pending migrations and returns the store. A file it refuses is left as
// it was: every refusal is decided before the first write.
//
// Errors: *domain.ValidationError (Field "database") when pathOrURI names
// no file; *domain.StoreError of kind StoreUnreachable (a missing
// directory, *LinkedFileError, *MountedFileError, *SideFileError, ErrWALWithoutIndex,
// ErrHotJournal), StoreReadOnly, StoreCorrupt (not a database),
// StoreSchema (ErrForeignLocksTable, ErrForeignSchemaObject) or StoreBusy;
// *domain.OwnerInUseError for an Options.Owner another open DB claims.
func Open(ctx context.Context, pathOrURI string, opts Options) (*DB, error) {
	dsn, err := DSN(pathOrURI, opts.BusyTimeout)
	if err != nil {
		return nil, err // a *domain.ValidationError, before anything is created
	}
	path := filePath(dsn)
	op := "open lock store " + path
	if readOnlyMode(dsn) {
		return nil, readOnlyModeError(op, dsn) // before anything is created
	}
	// Connections and side files name the file path names now, whatever
	// a later chdir; a planted side file is refused before anything is made.
	real := sidePath(path)
	if err := checkSideFiles(real); err != nil {
		return nil, FormatError(op, err)
	}
	if err := createPrivate(path); err != nil {
		return nil, FormatError(op, err)
	}
	if err := checkOneName(op, path); err != nil {
		return nil, err
	}
	file, err := os.Stat(path)
	if err != nil {
		return nil, FormatError(op, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, FormatError(op, err)
	}
	dsn = withPath(dsn, real)
	// SQLite would open a file this process cannot write read-only, leave
	// -wal and -shm behind, and fail only at the first write.
	if err := CheckWritable(dsn); err != nil {
		return nil, err
	}
	// Every other refusal comes before the first write: the switch to WAL.
	if err := preflight(ctx, op, dsn, real); err != nil {
		return nil, err
	}
	claim, err := claimOwner(real, opts.Owner)
	var inUse *domain.OwnerInUseError
	if errors.As(err, &inUse) {
		return nil, err
	}
	if err != nil {
		return nil, FormatError(op, err)
	}
	rdb := openPool(dsn, real)
	wdb := openPool(dsn+"&_pragma=wal_autocheckpoint(0)&_pragma="+walSizePragma, real) // checkpointer's job
	// Connections are costly to open (the pragmas): keep all, open few.
	rdb.SetMaxOpenConns(maxReaders)
	rdb.SetMaxIdleConns(maxReaders)
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	db := &DB{sql: rdb, wsql: wdb, writer: make(chan struct{}, 1), path: path, file: file, abs: abs, claim: claim}
	db.commits.db = db
	db.checkpoints.init(rdb, real+"-wal")
	fail := func(err error) (*DB, error) { db.Close(); return nil, err }
	if err := db.migrate(ctx, "migrate lock store "+path); err != nil {
		return fail(err)
	}
	// The side file comes only once the file proved to be a lock store.
	if db.writers, err = openWriterQueue(real, busyTimeout(dsn)); err != nil {
		return fail(FormatError(op, err))
	}
	if db.wake, err = openWakeFile(real); err != nil {
		return fail(FormatError(op, err))
	}
	if db.commits.savepoints, err = prepareSavepoints(ctx, wdb); err != nil {
		return fail(FormatError(op, err))
	}
	store, err := entstore.New(ctx, rdb, wdb, db.backend())
	if err != nil {
		return fail(err)
	}
	if db.store, err = newLockRepository(ctx, store, db); err != nil {
		store.Close()
		return fail(err)
	}
	return db, nil
}

// sqliteDriver is the driver registered as "sqlite".
var sqliteDriver = func() driver.Driver {
	db, err := sql.Open("sqlite", "")
	if err != nil {
		panic("the sqlite driver is not registered: " + err.Error())
	}
	defer db.Close()
	return db.Driver()
}()

// sideFileConnector checks SQLite's side files before each connection:
// SQLite would block for ever on a FIFO planted there, before the driver's hooks run.
type sideFileConnector struct {
	dsn, path string
}

func (c sideFileConnector) Connect(context.Context) (driver.Conn, error) {
	if err := checkSQLiteSideFiles(c.path); err != nil {
		return nil, err
	}
	return sqliteDriver.Open(c.dsn)
}

func (c sideFileConnector) Driver() driver.Driver { return sqliteDriver }

func openPool(dsn, path string) *sql.DB { return sql.OpenDB(sideFileConnector{dsn: dsn, path: path}) }

// NewLockRepository returns the lock repository of db.
func NewLockRepository(db *DB) *LockRepository { return db.store }

// backend is what SQLite brings to the shared store: group commit, and its
// errors. BEGIN IMMEDIATE keeps other writers out: no per-resource lock.
func (db *DB) backend() entstore.Backend {
	return entstore.Backend{Dialect: dialect.SQLite, WriteTx: db.commits.run, SharedTx: true, FormatError: db.formatError,
		Released: db.wake.freed}
}

// Wakeups returns what wakes a waiter when a holder in another process on
// the file releases, or nil without inotify: waiters then poll.
func (db *DB) Wakeups() application.Wakeups {
	if db.wake == nil {
		return nil
	}
	return db.wake
}

// WriteStats counts the writes of a DB since it opened: Writes ran in
// Transactions, Shared of them with other writes.
type WriteStats struct {
	Transactions, Writes, Shared int64
}

// WriteStats returns the counts of db's writes so far.
func (db *DB) WriteStats() WriteStats {
	db.commits.mu.Lock()
	defer db.commits.mu.Unlock()
	return db.commits.stats
}

// Path returns the database file, or "" for an in-memory database.
func (db *DB) Path() string { return db.path }

// Close closes the database. Call it after the last use of the store.
func (db *DB) Close() error {
	var err error
	db.checkpoints.close()
	if db.store != nil {
		err = db.store.Close()
	}
	err = errors.Join(err, db.sql.Close())
	if db.wsql != nil {
		err = errors.Join(err, db.wsql.Close())
	}
	if db.commits.savepoints != nil {
		db.commits.savepoints.close()
	}
	if db.writers != nil {
		err = errors.Join(err, db.writers.close())
	}
	err = errors.Join(err, db.wake.close(), db.claim.close())
	return FormatError("close lock store", err)
}

// migrate applies the pending migrations, after adopting an earlier
// version's history. A process that loses a race to apply one sees an
// error, then nothing pending.
func (db *DB) migrate(ctx context.Context, op string) error {
	fsys, _ := fs.Sub(migrationFiles, "migrations") // fails only for an invalid path
	p, err := goose.NewProvider(goose.DialectSQLite3, db.wsql, fsys, goose.WithTableName(entstore.VersionTable))
	if err != nil {
		return &domain.StoreError{Op: op, Err: err}
	}
	err = entstore.Retry(ctx, writeAttempts, func(error) bool { return ctx.Err() == nil }, func(ctx context.Context) error {
		if err := db.adoptHistory(ctx, fsys); err != nil {
			return err
		}
		err := db.withWriter(ctx, func() error { _, err := p.Up(ctx); return err })
		if err != nil {
			if pending, perr := p.HasPending(ctx); perr == nil && !pending {
				return nil // another process applied it meanwhile
			}
		}
		return err
	})
	return FormatError(op, err)
}

// withWriter runs fn as this process's only writer, unless ctx ends first.
func (db *DB) withWriter(ctx context.Context, fn func() error) error {
	select {
	case db.writer <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-db.writer }()
	return fn()
}

// openWriterQueue opens the side file read-only (all flock needs), created
// with the database's permissions so that all who may write may queue;
// one this process may not open only costs the queue.
func openWriterQueue(path string, timeout time.Duration) (*writerQueue, error) {
	q := &writerQueue{timeout: timeout}
	if !haveFileLocks || path == "" {
		return q, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	f, err := openSideFile(path, path+"-lock", os.O_RDONLY|os.O_CREATE, fi.Mode().Perm())
	if errors.Is(err, fs.ErrPermission) {
		return q, nil
	}
	if err != nil {
		return nil, err
	}
	q.f = f
	return q, nil
}

func (q *writerQueue) close() error {
	if q.f == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	return q.f.Close()
}

func prepareSavepoints(ctx context.Context, db *sql.DB) (*savepoints, error) {
	var sp savepoints
	var err error
	for _, p := range []struct {
		st    **sql.Stmt
		query string
	}{{&sp.begin, "SAVEPOINT write"}, {&sp.release, "RELEASE write"}, {&sp.rollback, "ROLLBACK TO write"}} {
		if *p.st, err = db.PrepareContext(ctx, p.query); err != nil {
			sp.close()
			return nil, err
		}
	}
	return &sp, nil
}

func (sp *savepoints) close() {
	for _, st := range []*sql.Stmt{sp.begin, sp.release, sp.rollback} {
		if st != nil {
			st.Close()
		}
	}
}

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

// adoptHistory adopts, once, the history an earlier version of the module
// recorded (entstore.AdoptHistory), in one BEGIN IMMEDIATE transaction.
func (db *DB) adoptHistory(ctx context.Context, fsys fs.FS) error {
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
