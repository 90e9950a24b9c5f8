package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/cleveragents/locks/domain"
)

// ErrForeignLocksTable matches the refusal (a *domain.StoreError of kind
// StoreSchema) of a file with a table named locks, in any letter case, that
// the store's migration did not create: another application's table.
var ErrForeignLocksTable = errors.New("the file has a table named locks that the lock store did not create " +
	"(its migration " + MigrationName + " is not recorded)")

// ErrForeignSchemaObject matches the refusal (a *domain.StoreError of kind
// StoreSchema naming the objects) of a file with a view, index, trigger or
// table named, in any letter case, as an object the store's migration
// creates: they share one namespace, so the migration would fail on it after
// the journal switch and the version table had changed the file.
var ErrForeignSchemaObject = errors.New("the file has objects named as those that the lock store's migration " +
	MigrationName + " creates, which it did not create")

// ErrWALWithoutIndex matches the refusal (a *domain.StoreError of kind
// StoreUnreachable) of a WAL file whose -wal exists without its -shm index:
// SQLite can read it only by creating the -shm, and its last connection
// would then copy the commits into the file.
var ErrWALWithoutIndex = errors.New("this -wal file holds commits not yet copied into the file, and the file's -shm file, " +
	"the index by which SQLite reads them, is missing: reading the file would create the -shm file")

const walWithoutIndexAdvice = "if no program has the file open, open it once with the program that made it " +
	"(or with sqlite3, as a user who may write it): SQLite rebuilds the index, and copies the commits into the file when it closes it; " +
	"do not remove the -wal file, which holds them; the file was left as it was"

// ErrHotJournal matches the refusal (a *domain.StoreError of kind
// StoreUnreachable) of a file whose -journal is hot: a program stopped
// mid-transaction, and SQLite rolls it back on the next connection that may
// write, and refuses to read it on one that may not.
var ErrHotJournal = errors.New("a program stopped in the middle of a transaction on the file: " +
	"this -journal file holds what is to be rolled back before the file can be read")

const hotJournalAdvice = "open the file with the program that wrote it (or with sqlite3, as a user who may write it), " +
	"which rolls the transaction back; do not remove the -journal file, without which the file stays half-written; " +
	"the lock store rolls back no file it has not proved to be its own, and left this one as it was"

const foreignLocksAdvice = "point the service at a lock database of its own (a path where no file exists yet creates one), " +
	"and leave this file to the application that made it; the file was left as it was"

// preflight decides, by reading only, whether Open may make the file at
// path (named by sidePath) a lock store: the journal switch, the version
// table and the migrations all write it, so every reason to refuse must be
// found first. A file with other tables only is shared with an application.
func preflight(ctx context.Context, op, dsn, path string) error {
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		return nil // new, or empty: SQLite's empty database
	}
	var st SchemaState
	err := quietRead(ctx, op, dsn, path, func(sdb *sql.DB) (err error) {
		st, err = (&DB{sql: sdb}).Schema(ctx)
		return err
	})
	switch {
	case err != nil:
		return err
	case st.MigrationApplied:
		return nil
	case st.LocksTable:
		return &domain.StoreError{Op: op, Kind: domain.StoreSchema, Advice: foreignLocksAdvice,
			Err: fmt.Errorf("%s: %w", path, ErrForeignLocksTable)}
	case len(st.Conflicts) > 0:
		return &domain.StoreError{Op: op, Kind: domain.StoreSchema, Advice: foreignLocksAdvice,
			Err: fmt.Errorf("%s: %w: %s", path, ErrForeignSchemaObject, strings.Join(st.Conflicts, ", "))}
	}
	return nil
}

// quietAttempts bounds how often a file is read again: when it changed
// while read alone, or while another process recovers its -shm index.
const quietAttempts = 5

// hotJournalPatience is how long a -journal, or a -wal without its -shm,
// is looked at again before refusing: a writer at work has them for
// milliseconds; what a stopped program left stays.
const hotJournalPatience = 2 * time.Second

func quietPause(attempt int) time.Duration {
	return min(time.Duration(attempt)*10*time.Millisecond, 50*time.Millisecond)
}

// quietRead runs read on a pool of one connection to the non-empty
// database at path (named by sidePath) that changes no file: no write, no
// file created, removed or rolled back, no checkpoint at close (which a
// connection that may write makes even with query_only). Errors are
// formatted for op.
func quietRead(ctx context.Context, op, dsn, path string, read func(*sql.DB) error) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		patient := time.Since(start) < hotJournalPatience
		before, _ := os.Stat(path)
		wal, err := readHeader(ctx, dsn, path)
		if isCorrupt(err) && changedMeanwhile(path, before) != nil {
			err = errChangedMeanwhile // read alone while a writer was at work
		}
		var acc access
		switch {
		case errors.Is(err, errNotDatabase):
			return &domain.StoreError{Op: op, Kind: domain.StoreCorrupt, Err: err}
		case errors.Is(err, errChangedMeanwhile):
		case err != nil:
			return FormatError(op, err)
		default:
			acc, err = quietAccess(path, wal)
		}
		if err == nil {
			before, _ = os.Stat(path)
			sdb := openPool(readOnlyDSN(dsn, acc), path)
			sdb.SetMaxOpenConns(1)
			err = read(sdb)
			sdb.Close()
			// Read alone, the file may have been half-written by another
			// opener migrating it: then what was read is not the file.
			if acc.immutable && (err == nil || isCorrupt(err)) {
				if changed := changedMeanwhile(path, before); changed != nil || err == nil {
					err = changed
				}
			}
		}
		switch {
		case err == nil:
			return nil
		case (isHot(err) || errors.Is(err, ErrWALWithoutIndex)) && patient,
			readOnlyShmTransient(err) && attempt < quietAttempts,
			acc.readOnlyShm && shmGone(err) && attempt < quietAttempts,
			errors.Is(err, errChangedMeanwhile) && attempt < quietAttempts:
		case errors.Is(err, errChangedMeanwhile):
			return &domain.StoreError{Op: op, Kind: domain.StoreBusy,
				Err: fmt.Errorf("%s: other processes changed the file each time it was read", path)}
		default:
			return quietError(op, path, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(quietPause(attempt)):
		}
	}
}

// errChangedMeanwhile: a file read alone (immutable, without locks)
// changed or gained a -wal meanwhile.
var errChangedMeanwhile = errors.New("changed while it was read")

// changedMeanwhile returns errChangedMeanwhile unless the file at path is
// still as it was before a read (the same file, size and modification
// time), without a -wal.
func changedMeanwhile(path string, before os.FileInfo) error {
	after, _ := os.Stat(path)
	walNow, _ := nonEmpty(path + "-wal")
	if !walNow && os.SameFile(before, after) && before.Size() == after.Size() && before.ModTime().Equal(after.ModTime()) {
		return nil
	}
	return errChangedMeanwhile
}

// quietAccess is how quietRead reads the database at path: with mode=ro
// outside WAL mode; through both -wal and -shm, the -shm read-only; and
// alone (immutable) without a -wal, read again if it changed meanwhile.
func quietAccess(path string, wal bool) (access, error) {
	if acc, decided, err := walAccess(path, wal); decided || err != nil {
		return acc, err
	}
	// A journal beside a file in WAL mode is left by a journal switch that
	// stopped half-way: reading the file alone would miss its rollback.
	if hot, _ := nonEmpty(path + "-journal"); hot {
		return access{}, hotJournal(path)
	}
	return access{mode: "ro", immutable: true}, nil
}

// walAccess is the choice quietAccess and readAccess share: decided is
// false for a file in WAL mode with neither a -wal with its -shm, nor a
// -wal with frames in it.
func walAccess(path string, wal bool) (acc access, decided bool, err error) {
	if !wal {
		return access{mode: "ro"}, true, nil
	}
	walExists, err := exists(path + "-wal")
	var shmExists, walFull bool
	if err == nil {
		shmExists, err = exists(path + "-shm")
	}
	if err == nil {
		walFull, err = nonEmpty(path + "-wal")
	}
	switch {
	case err != nil:
		return access{}, true, err
	case walExists && shmExists:
		return access{mode: "ro", readOnlyShm: true}, true, nil
	case walFull:
		return access{}, true, fmt.Errorf("%s-wal: %w", path, ErrWALWithoutIndex)
	}
	return access{}, false, nil
}

func hotJournal(path string) error { return fmt.Errorf("%s-journal: %w", path, ErrHotJournal) }

// quietError formats err, met reading the database at path, for op: a hot
// journal (SQLITE_READONLY_ROLLBACK to a read-only connection) and a -wal
// without its -shm are told for what they are, not as a read-only file.
func quietError(op, path string, err error) error {
	switch {
	case isHot(err):
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Advice: hotJournalAdvice, Err: hotJournal(path)}
	case errors.Is(err, ErrWALWithoutIndex):
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: err, Advice: walWithoutIndexAdvice}
	}
	return FormatError(op, err)
}

// sqliteCode returns the extended result code of SQLite's error in err, or 0.
func sqliteCode(err error) int {
	var serr *sqlite.Error
	if errors.As(err, &serr) {
		return serr.Code()
	}
	return 0
}

// isHot reports a hot journal, told by quietAccess or readAccess, or by SQLite.
func isHot(err error) bool { return errors.Is(err, ErrHotJournal) || isHotJournal(err) }

// isHotJournal reports SQLite's refusal to read a file whose journal is
// hot on a connection that may not roll it back.
func isHotJournal(err error) bool { return sqliteCode(err) == sqlite3.SQLITE_READONLY_ROLLBACK }

// isCorrupt reports whether SQLite found the file damaged.
func isCorrupt(err error) bool {
	c := sqliteCode(err) & 0xff
	return c == sqlite3.SQLITE_CORRUPT || c == sqlite3.SQLITE_NOTADB
}

// shmGone reports SQLite's failure to open a -shm that existed when the
// access was chosen: the last process closed the store meanwhile, removing
// -wal and -shm. Looking again finds it closed.
func shmGone(err error) bool { return sqliteCode(err)&0xff == sqlite3.SQLITE_CANTOPEN }

// readOnlyShmTransient reports SQLite's refusals to read through a
// read-only -shm that last only while the process that has the database
// open recovers or resets its index: read again.
func readOnlyShmTransient(err error) bool {
	return slices.Contains([]int{sqlite3.SQLITE_READONLY_CANTINIT, sqlite3.SQLITE_READONLY_RECOVERY, sqlite3.SQLITE_BUSY_RECOVERY}, sqliteCode(err))
}
