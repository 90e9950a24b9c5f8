package sqlite

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

const sqliteMagic = "SQLite format 3\x00"

var errNotDatabase = errors.New("the file does not begin with the SQLite header")

// OpenReadOnly opens the existing database at pathOrURI for diagnostics,
// changing nothing (readAccess); writes through the DB fail (StoreReadOnly).
// Errors: a *domain.ValidationError (Field "database") when pathOrURI names
// no file; a *domain.StoreError: StoreCorrupt for a file not a database, or
// StoreUnreachable (fs.ErrNotExist, unreadable now, *LinkedFileError, *MountedFileError,
// *SideFileError, ErrWALWithoutIndex, ErrHotJournal).
func OpenReadOnly(ctx context.Context, pathOrURI string, opts Options) (*DB, error) {
	dsn, err := DSN(pathOrURI, opts.BusyTimeout)
	if err != nil {
		return nil, err // a *domain.ValidationError
	}
	path := filePath(dsn)
	op := "inspect lock store " + path
	// A second name reads through a journal of its own.
	if err := checkOneName(op, path); err != nil {
		return nil, err
	}
	real := sidePath(path)
	dsn = withPath(dsn, real)
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
	// Nothing prepared: a missing locks table is for Schema to report.
	db.store = &LockRepository{Store: entstore.NewReadOnly(ctx, sdb, db.backend())}
	return db, nil
}

// readPool opens OpenReadOnly's pool on path (resolved: real). A nil pool
// without error: the store was closed meanwhile (shmGone); look again.
func readPool(ctx context.Context, op, dsn, path, real string, start time.Time) (*sql.DB, error) {
	var acc access
	var err error
	for attempt := 1; ; attempt++ {
		var wal bool
		wal, err = readHeader(ctx, op, dsn, path)
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
	// Damage, or a hot journal, is reported now rather than by a query.
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
	mode        string // "ro", or "rw" (always with query_only)
	immutable   bool   // read the file alone, trusting nothing changes it
	readOnlyShm bool   // SQLite neither creates nor changes the -shm
}

// readAccess chooses how OpenReadOnly reads without a -wal: immutable only where nobody
// could write (it might read pages a writer replaces); else mode=rw as root or the owner,
// so that SQLite removes the -wal and -shm it creates at the last close (mode=ro would not).
func readAccess(path string, wal bool) (access, error) {
	if acc, decided, err := walAccess(path, wal); decided || err != nil {
		return acc, err
	}
	if nobodyCanWrite(path) {
		return access{mode: "ro", immutable: true}, nil
	}
	if n, _ := fileSize(path + "-journal"); n > 0 {
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

// nobodyCanWrite: only root could write the database or create a -wal.
func nobodyCanWrite(path string) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	di, err := os.Stat(filepath.Dir(path))
	const anyWrite = 0o222
	return err == nil && (fi.Mode().Perm()&anyWrite == 0 || di.Mode().Perm()&anyWrite == 0 || readOnlyMount(path))
}

// fileSize returns the size of the file at path (lstat), or -1 if there is none.
func fileSize(path string) (int64, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return -1, nil
	case err != nil:
		return 0, err
	}
	return fi.Size(), nil
}

// readHeader reports WAL mode, or StoreCorrupt for op, reading through SQLite:
// closing a descriptor of its own would drop this process's POSIX locks.
func readHeader(ctx context.Context, op, dsn, path string) (wal bool, err error) {
	if _, err := os.Stat(path); err != nil {
		return false, err // a missing file is not for SQLite to create
	}
	if err := fileReadable(path); err != nil {
		return false, err // SQLite would say only "unable to open"
	}
	db, _ := sql.Open("sqlite", readOnlyDSN(dsn, access{mode: "ro", immutable: true})) // the driver cannot fail it
	defer db.Close()
	var page []byte
	err = db.QueryRowContext(ctx, "SELECT data FROM sqlite_dbpage WHERE pgno = 1").Scan(&page)
	notDatabase := &domain.StoreError{Op: op, Kind: domain.StoreCorrupt, Err: errNotDatabase}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // an empty file
	case sqliteCode(err) == sqlite3.SQLITE_NOTADB:
		return false, notDatabase
	case err != nil:
		return false, err
	case len(page) < 100 || string(page[:len(sqliteMagic)]) != sqliteMagic:
		return false, notDatabase
	}
	return page[18] == 2 && page[19] == 2, nil
}

// readOnlyDSN turns dsn into one that opens as acc says and writes nothing.
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

// SchemaState is what Schema found; names compare in any letter case.
type SchemaState struct {
	MigrationApplied bool     // goose records MigrationName as applied
	LocksTable       bool     // a table named locks exists, whoever created it
	OtherTables      []string // sorted tables of neither the store nor SQLite
	Conflicts        []string // "type name", sorted: what the migration would fail on, bar tables locks and version
}

// migrationObjects are the lower-case names of what the migrations create.
var migrationObjects = func() map[string]bool {
	names := map[string]bool{entstore.VersionTable: true}
	create := regexp.MustCompile("(?i)CREATE\\s+(?:UNIQUE\\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?[`\"\\[]?(\\w+)")
	files, _ := fs.Glob(migrationFiles, "migrations/*.sql")
	for _, f := range files {
		b, _ := migrationFiles.ReadFile(f)
		for _, m := range create.FindAllStringSubmatch(string(b), -1) {
			names[strings.ToLower(m[1])] = true
		}
	}
	return names
}()

// Schema reads SchemaState, without creating goose's version table.
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
		if migrationObjects[lower] && !(typ == "table" && (lower == entlock.Table || lower == entstore.VersionTable)) {
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
	// Versions of the module older than its version table used goose's.
	table, ok := tables[entstore.VersionTable]
	if !ok {
		table, ok = tables[legacy]
	}
	if !ok {
		return st, nil
	}
	fsys, _ := fs.Sub(migrationFiles, "migrations") // cannot fail
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
// pathOrURI and create and remove its -wal and -shm, opening nothing.
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
