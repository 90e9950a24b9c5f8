package sqlite

// Diagnostics: a look at a lock database that changes nothing, not even by
// accident (Open would create the file, migrate it and switch it to WAL).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// sqliteMagic is how every SQLite database file begins.
const sqliteMagic = "SQLite format 3\x00"

var errNotDatabase = errors.New("the file does not begin with the SQLite header")

// OpenReadOnly opens the existing database at pathOrURI for reading only:
// it creates nothing, migrates nothing and leaves the journal mode as it
// is; writes through the returned DB fail with a StoreReadOnly error. It
// sees what other processes commit meanwhile, leaves no -wal or -shm behind
// that the owner could not write (readAccess), and reads the file only
// through SQLite, so this process's other connections keep their locks.
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
	// A second name reads through a journal of its own, without what the
	// processes writing through the other name committed.
	if err := checkOneName(op, path); err != nil {
		return nil, err
	}
	real := sidePath(path)
	dsn = withPath(dsn, real)
	// SQLite would block for ever on a FIFO at a side file: each connection
	// checks them (sideFileConnector), and so does this, before any read.
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
	// No statements are prepared: a missing locks table is for the schema
	// check to report, and reads fall back to plain queries.
	db.store = &LockRepository{Store: entstore.NewReadOnly(sdb, db.backend())}
	return db, nil
}

// readPool opens OpenReadOnly's pool on the database at path (real is its
// resolved name) as readAccess chooses, patient with a writer's -journal or
// -wal since start. A nil pool without error means that the processes that
// had the store open closed it while it was read through their -shm
// (shmGone): the caller looks again.
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
	// Reading the catalogue has SQLite parse the file now, so that damage
	// (or a hot journal, which a read-only connection refuses) is reported
	// here rather than by the first query.
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
	mode        string // "ro", or "rw" (with query_only, as always)
	immutable   bool   // read the file alone, trusting that nothing changes it
	readOnlyShm bool   // readonly_shm=1: SQLite neither creates nor changes the -shm
}

// readAccess decides how to read the database at path (named by sidePath),
// in WAL mode or not, so that the reads see what other processes commit
// and nothing is left behind that could keep the application from writing:
//
//   - Not in WAL mode: mode=ro, with SQLite's file locks, creating nothing.
//   - Both -wal and -shm exist: mode=ro with readonly_shm=1 (walAccess).
//   - A -wal with frames but no -shm: ErrWALWithoutIndex (walAccess).
//   - No -wal, and only root could write the database or create a -wal:
//     immutable=1, without locks. Were a writer possible, immutable could
//     serve pages it is replacing: stale reads, or SQLITE_CORRUPT.
//   - No -wal, no hot journal (a connection that may write rolls it back),
//     and this user is root or the owner and can write the database and its
//     directory: mode=rw with query_only. SQLite creates -wal and -shm,
//     owned as the application's would be, and removes them at the last
//     close (mode=ro would leave them), whose checkpoint is its only write.
//   - Otherwise the database cannot be read safely now: the error says why.
func readAccess(path string, wal bool) (access, error) {
	if acc, decided, err := walAccess(path, wal); decided || err != nil {
		return acc, err
	}
	if nobodyCanWrite(path) {
		return access{mode: "ro", immutable: true}, nil
	}
	if hot, _ := nonEmpty(path + "-journal"); hot {
		return access{}, hotJournal(path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return access{}, err
	}
	err = ownerOrRoot(fi)
	if err == nil {
		err = fileWritable(path)
	}
	if err == nil {
		err = dirWritable(filepath.Dir(path))
	}
	if err != nil {
		return access{}, fmt.Errorf("reading it needs its -wal and -shm files, which do not exist, and %w", err)
	}
	return access{mode: "rw"}, nil
}

// nobodyCanWrite reports whether no process but root could write the
// database at path or create a -wal file beside it.
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

// nonEmpty reports whether the file at path has anything in it, as a -wal
// holds frames: a read-only connection opens the -wal with O_CREAT, so one
// that looked while the last process closed the store leaves an empty one.
func nonEmpty(path string) (bool, error) {
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

// readHeader reports whether the file at path is a database in WAL mode
// (header bytes 18 and 19 are 2); an empty file is SQLite's empty database.
// It reads page 1 through SQLite (sqlite_dbpage, immutable=1), never with a
// descriptor: closing one would drop every POSIX lock this process holds on
// the file, and another process could then delete -wal and -shm under them.
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
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // an empty file
	case sqliteCode(err) == sqlite3.SQLITE_NOTADB:
		return false, errNotDatabase
	case err != nil:
		return false, err
	case len(page) < 100 || string(page[:len(sqliteMagic)]) != sqliteMagic:
		return false, errNotDatabase
	}
	return page[18] == 2 && page[19] == 2, nil
}

// readOnlyDSN turns a DSN made by DSN into one that opens the database as
// acc says, without the settings that would change the file, and refuses
// statements that write (query_only).
func readOnlyDSN(dsn string, acc access) string {
	base, q, _ := splitDSN(dsn)
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

// SchemaState is what Schema found in a database. Names compare in any
// letter case, as SQLite's do.
type SchemaState struct {
	// MigrationApplied: goose records MigrationName as applied.
	MigrationApplied bool
	// LocksTable: a table named locks exists, whoever created it.
	LocksTable bool
	// OtherTables are the tables of neither the lock store nor SQLite,
	// sorted: another application's, whose file was named by mistake.
	OtherTables []string
	// Conflicts are, while MigrationApplied is false, the objects other
	// than a locks or version table named as one the store's migrations
	// create or as its version table, each as "type name", sorted: they
	// share one namespace, so the migration would fail on each.
	Conflicts []string
}

// migrationObjects are the lower-case names of the objects that the store's
// migrations create, read from their CREATE statements, and of its version
// table.
var migrationObjects = func() map[string]bool {
	names := map[string]bool{entstore.VersionTable: true}
	create := regexp.MustCompile("(?i)CREATE\\s+(?:UNIQUE\\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?[`\"\\[]?(\\w+)")
	// go:embed fails the build without a match, and embedded files read.
	files, _ := fs.Glob(migrationFiles, "migrations/*.sql")
	for _, f := range files {
		b, _ := migrationFiles.ReadFile(f)
		for _, m := range create.FindAllStringSubmatch(string(b), -1) {
			names[strings.ToLower(m[1])] = true
		}
	}
	return names
}()

// Schema reports whether MigrationName has been applied, whether the locks
// table exists, and what else in the file the migration would meet. Unlike
// MigrationApplied it only reads: goose would create its version table.
func (db *DB) Schema(ctx context.Context) (SchemaState, error) {
	const op = "read schema"
	var st SchemaState
	tables := map[string]string{} // lower case -> as written
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
	legacy := strings.ToLower(entstore.LegacyVersionTable)
	for lower, name := range tables {
		if lower != entlock.Table && lower != entstore.VersionTable && lower != legacy && !strings.HasPrefix(lower, "sqlite_") {
			st.OtherTables = append(st.OtherTables, name)
		}
	}
	slices.Sort(st.OtherTables)
	slices.Sort(st.Conflicts)
	// The module's version table or, where only versions older than it
	// opened the file, goose's default one.
	table, ok := tables[entstore.VersionTable]
	if !ok {
		table, ok = tables[legacy]
	}
	if !ok {
		return st, nil
	}
	fsys, _ := fs.Sub(migrationFiles, "migrations") // a valid name: no error
	version, err := entstore.MigrationVersion(fsys, MigrationName)
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
// pathOrURI, and create and remove files in its directory as SQLite does
// for -wal and -shm. It opens nothing (see fileWritable), so it may be
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
	err = fileWritable(path)
	if err == nil {
		err = dirWritable(filepath.Dir(path))
	}
	if err != nil {
		return &domain.StoreError{Op: op, Kind: domain.StoreReadOnly, Err: err}
	}
	return nil
}
