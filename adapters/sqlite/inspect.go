package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

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
// It never creates the database, applies no migration and leaves the
// journal mode as it is; writes through the returned DB fail with a
// StoreReadOnly error. It sees what other processes commit meanwhile, and
// leaves no -wal or -shm behind that its owner could not write
// (readAccess). It reads the file only through SQLite, so the locks of
// this process's other connections stay in place.
//
// Errors: a *domain.ValidationError (Field "database") when pathOrURI names
// no file, such as an in-memory database; a *domain.StoreError:
// StoreUnreachable wrapping fs.ErrNotExist when the file does not exist,
// StoreCorrupt when it is not a database, StoreUnreachable with advice when
// this user cannot read it safely now, or wrapping a *LinkedFileError when
// the file has more than one name, a *SideFileError when something is
// planted at SQLite's -journal, -wal or -shm, ErrWALWithoutIndex when a
// -wal file exists without its -shm, or ErrHotJournal when a program
// stopped in the middle of a transaction on the file.
func OpenReadOnly(ctx context.Context, pathOrURI string, opts Options) (*DB, error) {
	dsn, err := DSN(pathOrURI, opts.BusyTimeout)
	if err != nil {
		return nil, err // a *domain.ValidationError
	}
	path := filePath(dsn)
	op := "inspect lock store " + path
	// A second name reads through a journal of its own, which lacks what
	// the processes that write through the other name committed.
	if err := checkOneName(op, path); err != nil {
		return nil, err
	}
	// The reading connections are opened as they are needed: all of them
	// must reach the file that path names now, whatever the process's
	// working directory by then (sidePath).
	real := sidePath(path)
	dsn = withPath(dsn, real)
	// SQLite opens its side files without a question, and would block for
	// ever on a FIFO there: each connection checks them first
	// (sideFileConnector), and so does this, before anything is read.
	if err := checkSQLiteSideFiles(real); err != nil {
		return nil, FormatError(op, err)
	}
	start := time.Now()
	var sdb *sql.DB
	for round := 1; sdb == nil; round++ {
		if sdb, err = readPool(ctx, op, dsn, path, real, start); err != nil {
			return nil, err
		}
		if sdb == nil && round == quietAttempts {
			return nil, &domain.StoreError{Op: op, Kind: domain.StoreBusy,
				Err: fmt.Errorf("%s: the processes that had it open closed it each time it was read", path)}
		}
	}
	db := &DB{sql: sdb, writer: make(chan struct{}, 1), path: path}
	db.store = &LockRepository{Store: entstore.NewReadOnly(sdb, db.backend())}
	// No statements are prepared: the locks table may be missing, which is
	// for the schema check to report, and reads fall back to plain queries.
	return db, nil
}

// readPool opens OpenReadOnly's pool for op on the database at path (real
// is its resolved name) through dsn, in the way readAccess chooses. It
// returns a nil pool and no error when the processes that had the store
// open closed it while it was read through their -shm file (shmGone):
// the caller looks again. start is when OpenReadOnly began, for the
// patience with a -journal or -wal file of a writer at work.
func readPool(ctx context.Context, op, dsn, path, real string, start time.Time) (*sql.DB, error) {
	var acc access
	var err error
	for attempt := 1; ; attempt++ {
		var wal bool
		wal, err = readHeader(ctx, dsn, path)
		if errors.Is(err, errNotDatabase) {
			return nil, &domain.StoreError{Op: op, Kind: domain.StoreCorrupt, Err: err}
		}
		if err != nil {
			return nil, FormatError(op, err)
		}
		acc, err = readAccess(real, wal)
		if !(isHot(err) || errors.Is(err, ErrWALWithoutIndex)) || time.Since(start) >= hotJournalPatience {
			break
		}
		select {
		case <-ctx.Done():
			return nil, FormatError(op, ctx.Err())
		case <-time.After(quietPause(attempt)):
		}
	}
	if errors.Is(err, ErrWALWithoutIndex) || errors.Is(err, ErrHotJournal) {
		return nil, quietError(op, real, err)
	}
	if err != nil {
		return nil, &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: err,
			Advice: "inspect it as its owner or as root, or while the application has it open"}
	}
	sdb := openPool(readOnlyDSN(dsn, acc), real)
	// Reading the catalogue makes SQLite parse the file now, so that a
	// damaged one is reported here rather than by the first query (and a
	// hot journal, which SQLite refuses to read on a read-only connection,
	// as what it is).
	var n int
	for attempt := 1; ; attempt++ {
		err := sdb.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master").Scan(&n)
		if err == nil {
			break
		}
		if acc.readOnlyShm && shmGone(err) && ctx.Err() == nil {
			sdb.Close()
			return nil, nil
		}
		again := readOnlyShmTransient(err) && attempt < quietAttempts ||
			isHot(err) && time.Since(start) < hotJournalPatience
		if !again || ctx.Err() != nil {
			sdb.Close()
			return nil, quietError(op, real, err)
		}
		time.Sleep(quietPause(attempt))
	}
	return sdb, nil
}

// access is how OpenReadOnly and preflight have SQLite open a database.
type access struct {
	// mode is SQLite's mode parameter: "ro", or "rw" with query_only set.
	mode string
	// immutable reads the file alone, trusting that nothing changes it.
	immutable bool
	// readOnlyShm opens the -shm file read-only (readonly_shm=1): SQLite
	// neither creates nor changes it, and builds the index in its own
	// memory where no process has the database open.
	readOnlyShm bool
}

// readAccess decides how to read the database at path (named by
// sidePath), in WAL mode or not, so that the reads see what other
// processes commit meanwhile and nothing is left behind that could keep
// the application from writing.
//
// A database not in WAL mode (or an empty file) is read with mode=ro and
// SQLite's file locks, which create nothing. SQLite refuses it while its
// journal is hot (a program stopped in the middle of a transaction):
// rolling it back is for a connection that may write.
//
// A WAL database is read through its -wal file and its -shm index, which
// SQLite creates when missing, even for a read-only connection, owned by
// whoever creates them (by the database's owner when SQLite runs as
// root). A missing one is created only where the application would own
// it alike; a -shm the owner cannot write would fail its every write. In
// order:
//
//   - Both -wal and -shm exist: mode=ro with readonly_shm=1 reads through
//     them, creating and changing nothing; where no process has the
//     database open, SQLite builds the index in its own memory.
//   - A -wal file with frames exists without its -shm: its commits cannot
//     be read without creating the -shm (ErrWALWithoutIndex). An empty
//     one holds no commit (holdsFrames).
//   - No -wal file, and no process but root can write the database or
//     create a -wal beside it: immutable=1 reads the file alone, with no
//     lock. With a -wal, or any writer possible, immutable could serve
//     pages a writer is replacing: stale reads, or SQLITE_CORRUPT.
//   - No -wal file, no journal, and this user is root or the owner and
//     can write the database and its directory: mode=rw with query_only=1.
//     SQLite creates -wal and -shm and removes them at the last close, as
//     for the application (a mode=ro connection would leave them: removing
//     them takes a write lock). Its only write is that close's checkpoint
//     of what other processes committed meanwhile.
//   - Otherwise the database cannot be read safely now: the error says why.
func readAccess(path string, wal bool) (access, error) {
	if acc, decided, err := walAccess(path, wal); decided || err != nil {
		return acc, err
	}
	if nobodyCanWrite(path) {
		return access{mode: "ro", immutable: true}, nil
	}
	// A connection that may write rolls a hot journal back.
	if fi, err := os.Lstat(path + "-journal"); err == nil && fi.Size() > 0 {
		return access{}, fmt.Errorf("%s-journal: %w", path, ErrHotJournal)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return access{}, err
	}
	missing := fmt.Errorf("reading it needs its -wal and -shm files, which do not exist")
	if err := ownerOrRoot(fi); err != nil {
		return access{}, fmt.Errorf("%w, and %w", missing, err)
	}
	err = fileWritable(path)
	if err == nil {
		err = dirWritable(filepath.Dir(path))
	}
	if err != nil {
		return access{}, fmt.Errorf("%w, and %w", missing, err)
	}
	return access{mode: "rw"}, nil
}

// nobodyCanWrite reports whether no process but one running as root could
// write the database at path or create a -wal file beside it.
func nobodyCanWrite(path string) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	di, err := os.Stat(filepath.Dir(path))
	if err != nil {
		return false
	}
	const anyWrite = 0o222
	return fi.Mode().Perm()&anyWrite == 0 || di.Mode().Perm()&anyWrite == 0 || readOnlyMount(path)
}

// exists reports whether a file exists at path.
// holdsFrames reports whether the -wal file at path has anything in it:
// an empty one holds no commit. A connection that may only read opens the
// -wal file with O_CREAT, so one that looked while the last process closed
// the store (removing -wal and -shm) leaves an empty -wal behind.
func holdsFrames(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil && fi.Size() > 0, err
}

func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// readHeader reports whether the file at path is a database in WAL mode.
// An empty file is a valid, empty database to SQLite; any other file must
// begin with SQLite's header, whose bytes 18 and 19 are 2 in WAL mode.
//
// The header is read through SQLite (page 1 of sqlite_dbpage, immutable=1:
// no lock, nothing created), never with a descriptor of this package's:
// closing one would drop every POSIX lock this process holds on the file,
// the application's connections' included, and another process could
// then delete the -wal and -shm under them.
func readHeader(ctx context.Context, dsn, path string) (wal bool, err error) {
	if _, err := os.Stat(path); err != nil {
		return false, err // a missing file is not for SQLite to create
	}
	if err := fileReadable(path); err != nil {
		return false, err // SQLite would say only "unable to open"
	}
	db, err := sql.Open("sqlite", readOnlyDSN(dsn, access{mode: "ro", immutable: true}))
	if err != nil {
		return false, err
	}
	defer db.Close()
	var page []byte
	err = db.QueryRowContext(ctx, "SELECT data FROM sqlite_dbpage WHERE pgno = 1").Scan(&page)
	var serr *sqlite.Error
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // an empty file
	case errors.As(err, &serr) && serr.Code() == sqlite3.SQLITE_NOTADB:
		return false, errNotDatabase
	case err != nil:
		return false, err
	case len(page) < 100 || string(page[:len(sqliteMagic)]) != sqliteMagic:
		return false, errNotDatabase
	}
	return page[18] == 2 && page[19] == 2, nil
}

// readOnlyDSN turns a DSN made by DSN into one that opens the database as
// acc says and cannot write: the settings that would change the file are
// dropped, and statements that write are refused (query_only).
func readOnlyDSN(dsn string, acc access) string {
	base, query, _ := strings.Cut(dsn, "?")
	q, _ := url.ParseQuery(query) // DSN produced it, so it parses
	for _, k := range []string{"_journal_mode", "_journal", "_synchronous", "_sync", "_txlock",
		"_pragma", "_auto_vacuum", "_vacuum", "_query_only", "mode", "immutable", "readonly_shm"} {
		q.Del(k)
	}
	q.Set("mode", acc.mode)
	q.Set("_query_only", "1")
	if acc.immutable {
		q.Set("immutable", "1")
	}
	if acc.readOnlyShm {
		q.Set("readonly_shm", "1")
	}
	return base + "?" + q.Encode()
}

// SchemaState is what Schema found in a database.
type SchemaState struct {
	// MigrationApplied: goose records MigrationName as applied.
	MigrationApplied bool
	// LocksTable: a table named locks exists (in any letter case: SQLite's
	// names are case-insensitive), whoever created it.
	LocksTable bool
	// OtherTables are the tables that belong to neither the lock store
	// nor SQLite, sorted: those of another application, whose file a
	// command line may name by mistake.
	OtherTables []string
	// Conflicts are, while MigrationApplied is false, the objects other
	// than a locks table that are named (in any letter case) as one the
	// store's migrations create or as its version table, each as "type
	// name", sorted: SQLite's tables, views, indexes and triggers share
	// one namespace, so the migration would fail on each. A version table
	// that is a table is not one of them.
	Conflicts []string
}

// migrationObjects are the names, in lower case, of the objects that the
// store's migrations create, read from their CREATE statements, and of
// its version table.
var migrationObjects = func() map[string]bool {
	names := map[string]bool{entstore.VersionTable: true}
	create := regexp.MustCompile("(?i)CREATE\\s+(?:UNIQUE\\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?[`\"\\[]?(\\w+)")
	files, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil || len(files) == 0 {
		panic("sqlite: no migrations embedded")
	}
	for _, f := range files {
		b, err := migrationFiles.ReadFile(f)
		if err != nil {
			panic("sqlite: reading embedded migration " + f + ": " + err.Error())
		}
		for _, m := range create.FindAllStringSubmatch(string(b), -1) {
			names[strings.ToLower(m[1])] = true
		}
	}
	return names
}()

// Schema reports whether MigrationName has been applied, whether the
// locks table exists, and what else in the file the migration would meet.
// Unlike MigrationApplied it only reads: goose would create its version
// table in a database that lacks one.
func (db *DB) Schema(ctx context.Context) (SchemaState, error) {
	const op = "read schema"
	var st SchemaState
	// tables maps each table's name in lower case to its name as written.
	tables := map[string]string{}
	rows, err := db.sql.QueryContext(ctx, "SELECT type, name FROM sqlite_master")
	if err != nil {
		return st, FormatError(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ, name string
		if err := rows.Scan(&typ, &name); err != nil {
			return st, FormatError(op, err)
		}
		lower := strings.ToLower(name)
		if typ == "table" {
			tables[lower] = name
		}
		switch {
		case strings.HasPrefix(lower, "sqlite_") || !migrationObjects[lower]:
		case typ == "table" && (lower == entlock.Table || lower == entstore.VersionTable):
		default:
			st.Conflicts = append(st.Conflicts, typ+" "+name)
		}
	}
	if err := rows.Err(); err != nil {
		return st, FormatError(op, err)
	}
	_, st.LocksTable = tables[entlock.Table]
	for lower, name := range tables {
		switch {
		case lower == entlock.Table, lower == entstore.VersionTable, lower == strings.ToLower(entstore.LegacyVersionTable),
			strings.HasPrefix(lower, "sqlite_"):
		default:
			st.OtherTables = append(st.OtherTables, name)
		}
	}
	slices.Sort(st.OtherTables)
	slices.Sort(st.Conflicts)
	// The module's own version table or, in a database that only versions
	// of the module older than that table have opened, goose's default one.
	table, ok := tables[entstore.VersionTable]
	if !ok {
		table, ok = tables[strings.ToLower(entstore.LegacyVersionTable)]
	}
	if !ok {
		return st, nil
	}
	version, err := migrationVersion()
	if err != nil {
		return st, &domain.StoreError{Op: op, Err: err}
	}
	err = db.sql.QueryRowContext(ctx, "SELECT is_applied FROM \""+strings.ReplaceAll(table, "\"", "\"\"")+
		"\" WHERE version_id = ? ORDER BY id DESC LIMIT 1", version).Scan(&st.MigrationApplied)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return st, FormatError(op, err)
	}
	if st.MigrationApplied {
		st.Conflicts = nil // the migration created them
	}
	return st, nil
}

// CheckWritable reports whether this process could write the database at
// pathOrURI, and create and remove files in its directory, as SQLite does
// with the -wal and -shm files. It asks the operating system (access(2))
// and opens nothing: closing a descriptor of the file would drop the POSIX
// locks that SQLite connections of this process hold on it. It may be
// called while the database is open, by this process or another.
//
// Errors: a *domain.ValidationError when pathOrURI names no file; a
// *domain.StoreError of kind StoreReadOnly saying what is not writable, or
// StoreUnreachable when the file does not exist.
func CheckWritable(pathOrURI string) error {
	dsn, err := DSN(pathOrURI, 0)
	if err != nil {
		return err // a *domain.ValidationError
	}
	path := filePath(dsn)
	op := "check lock store " + path
	if _, err := os.Stat(path); err != nil {
		return FormatError(op, err)
	}
	if readOnlyMode(dsn) {
		return readOnlyModeError(op, dsn)
	}
	if err := fileWritable(path); err != nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly, Err: err}
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
