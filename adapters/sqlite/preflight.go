package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/cleveragents/locks/domain"
)

// ErrForeignLocksTable matches the refusal of a database file that has a
// table named locks (in any letter case: SQLite's names are
// case-insensitive) which the lock store's migration did not create: the
// table of another application, which the store must neither use nor
// build beside. The refusal is a *domain.StoreError of kind StoreSchema.
var ErrForeignLocksTable = errors.New("the file has a table named locks that the lock store did not create " +
	"(its migration " + MigrationName + " is not recorded)")

// ErrForeignSchemaObject matches the refusal of a database file that has
// an object (a view, an index, a trigger, or a table other than locks)
// named, in any letter case, as one that the lock store's migration
// creates: SQLite's tables, views, indexes and triggers share one
// namespace, so the migration would fail on it, after the journal switch
// and the version table had changed the file. The refusal is a
// *domain.StoreError of kind StoreSchema naming the objects.
var ErrForeignSchemaObject = errors.New("the file has objects named as those that the lock store's migration " +
	MigrationName + " creates, which it did not create")

// ErrWALWithoutIndex matches the refusal of a file in WAL mode whose
// "-wal" file (commits not yet copied into the file) exists without its
// "-shm" file (the index by which SQLite reads them): SQLite can read it
// only by creating the -shm file, and its last connection would then
// copy the commits into the file. The refusal is a *domain.StoreError of
// kind StoreUnreachable.
var ErrWALWithoutIndex = errors.New("this -wal file holds commits not yet copied into the file, and the file's -shm file, " +
	"the index by which SQLite reads them, is missing: reading the file would create the -shm file")

// walWithoutIndexAdvice is what to do about ErrWALWithoutIndex.
const walWithoutIndexAdvice = "if no program has the file open, open it once with the program that made it " +
	"(or with sqlite3, as a user who may write it): SQLite rebuilds the index, and copies the commits into the file when it closes it; " +
	"do not remove the -wal file, which holds them; the file was left as it was"

// ErrHotJournal matches the refusal of a file whose rollback journal
// ("-journal") is hot: a program stopped in the middle of a transaction
// on it, having overwritten pages of the file whose old contents the
// journal keeps. SQLite rolls it back on the next connection that may
// write, and refuses to read it on one that may not. The refusal is a
// *domain.StoreError of kind StoreUnreachable.
var ErrHotJournal = errors.New("a program stopped in the middle of a transaction on the file: " +
	"this -journal file holds what is to be rolled back before the file can be read")

// hotJournalAdvice is what to do about ErrHotJournal.
const hotJournalAdvice = "open the file with the program that wrote it (or with sqlite3, as a user who may write it), " +
	"which rolls the transaction back; do not remove the -journal file, without which the file stays half-written; " +
	"the lock store rolls back no file it has not proved to be its own, and left this one as it was"

// foreignLocksAdvice is what to do about ErrForeignLocksTable.
const foreignLocksAdvice = "point the service at a lock database of its own (a path where no file exists yet creates one), " +
	"and leave this file to the application that made it; the file was left as it was"

// preflight decides, by reading only, whether Open may make the file at
// path (named by sidePath) a lock store: the journal switch, the version
// table and the migrations all write it, so every reason to refuse (not a
// database, ErrForeignLocksTable, ErrForeignSchemaObject,
// ErrWALWithoutIndex, ErrHotJournal) must be found first. A file with
// other tables only is an application's database shared with the store.
func preflight(ctx context.Context, op, dsn, path string) error {
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		return nil // new, or empty: SQLite's empty database
	}
	var st SchemaState
	err := quietRead(ctx, op, dsn, path, func(sdb *sql.DB) (err error) {
		st, err = (&DB{sql: sdb}).Schema(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if st.MigrationApplied {
		return nil
	}
	if st.LocksTable {
		return &domain.StoreError{Op: op, Kind: domain.StoreSchema, Advice: foreignLocksAdvice,
			Err: fmt.Errorf("%s: %w", path, ErrForeignLocksTable)}
	}
	if len(st.Conflicts) > 0 {
		return &domain.StoreError{Op: op, Kind: domain.StoreSchema, Advice: foreignLocksAdvice,
			Err: fmt.Errorf("%s: %w: %s", path, ErrForeignSchemaObject, strings.Join(st.Conflicts, ", "))}
	}
	return nil
}

// quietAttempts bounds how often quietRead (and OpenReadOnly) read a file
// again: in WAL mode without a -wal file, because another process changed
// it meanwhile; through a read-only -shm, while a process that has the
// file open recovers or resets its index (readOnlyShmTransient).
const quietAttempts = 5

// hotJournalPatience is how long quietRead (and OpenReadOnly) look again
// at a -journal, or a -wal without its -shm, before refusing: a writer at
// work has them for milliseconds; what a stopped program left stays.
const hotJournalPatience = 2 * time.Second

// isHot reports whether err is a hot journal, told by quietAccess or
// readAccess, or by SQLite (isHotJournal).
func isHot(err error) bool {
	return errors.Is(err, ErrHotJournal) || isHotJournal(err)
}

// isCorrupt reports whether SQLite found the file damaged.
func isCorrupt(err error) bool {
	var serr *sqlite.Error
	if !errors.As(err, &serr) {
		return false
	}
	c := serr.Code() & 0xff
	return c == sqlite3.SQLITE_CORRUPT || c == sqlite3.SQLITE_NOTADB
}

// quietPause is the pause before quietRead's attempt after attempt.
func quietPause(attempt int) time.Duration {
	return min(time.Duration(attempt)*10*time.Millisecond, 50*time.Millisecond)
}

// quietRead runs read on a pool of one connection to the non-empty
// database at path (named by sidePath) through dsn that can change no
// file: no write, no file created, removed or rolled back, and no
// checkpoint at close (which a connection that may write makes even with
// query_only set). A rollback-journal file is read with mode=ro; a WAL
// file with both -wal and -shm through a read-only -shm; a WAL file
// without -wal alone (immutable=1), and again if it changed meanwhile.
// Errors are formatted for op.
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
			err = readWith(readOnlyDSN(dsn, acc), path, read)
			if acc.immutable && (err == nil || isCorrupt(err)) {
				// Read alone, the file may have been half-written by a
				// writer at work (another opener migrating it): what was
				// read, or found corrupt, is not the file if it changed.
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

// errChangedMeanwhile is quietRead's note that a file it read alone
// (immutable, without locks) changed or gained a -wal file meanwhile.
var errChangedMeanwhile = errors.New("changed while it was read")

// changedMeanwhile returns errChangedMeanwhile if the file at path, as it
// was before (before) a read, is no longer the same or has a -wal file.
func changedMeanwhile(path string, before os.FileInfo) error {
	after, _ := os.Stat(path)
	walNow, _ := holdsFrames(path + "-wal")
	if !walNow && before != nil && after != nil && sameContent(before, after) {
		return nil
	}
	return errChangedMeanwhile
}

// quietAccess is how quietRead reads the database at path, in WAL mode
// or not (see quietRead).
func quietAccess(path string, wal bool) (access, error) {
	if acc, decided, err := walAccess(path, wal); decided || err != nil {
		return acc, err
	}
	// A journal beside a file in WAL mode is left by a switch of the
	// journal mode that stopped half-way; reading the file alone would
	// read what it has not rolled back.
	if fi, err := os.Lstat(path + "-journal"); err == nil && fi.Size() > 0 {
		return access{}, fmt.Errorf("%s-journal: %w", path, ErrHotJournal)
	}
	return access{mode: "ro", immutable: true}, nil
}

// walAccess is the choice that quietAccess and readAccess share, for the
// database at path, in WAL mode or not: decided is false when neither a
// -wal file with its -shm nor one with frames in it is beside a file in
// WAL mode, and the caller decides.
func walAccess(path string, wal bool) (acc access, decided bool, err error) {
	if !wal {
		return access{mode: "ro"}, true, nil
	}
	walExists, err := exists(path + "-wal")
	if err != nil {
		return access{}, true, err
	}
	shmExists, err := exists(path + "-shm")
	if err != nil {
		return access{}, true, err
	}
	walFull, err := holdsFrames(path + "-wal")
	if err != nil {
		return access{}, true, err
	}
	switch {
	case walExists && shmExists:
		return access{mode: "ro", readOnlyShm: true}, true, nil
	case walFull:
		return access{}, true, walWithoutIndex(path)
	}
	return access{}, false, nil
}

// walWithoutIndex is ErrWALWithoutIndex for the database at path.
func walWithoutIndex(path string) error {
	return fmt.Errorf("%s-wal: %w", path, ErrWALWithoutIndex)
}

// readWith runs read on a pool of one connection through dsn to the
// database at path (named by sidePath), closed after it.
func readWith(dsn, path string, read func(*sql.DB) error) error {
	sdb := openPool(dsn, path)
	defer sdb.Close()
	sdb.SetMaxOpenConns(1)
	return read(sdb)
}

// sameContent reports whether two stats of a file show the same content:
// the same file, size and modification time.
func sameContent(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// quietError formats err, met by quietRead or OpenReadOnly reading the
// database at path, for op: a hot journal (which SQLite reports to a
// read-only connection as SQLITE_READONLY_ROLLBACK) and a -wal without
// its -shm are told for what they are, not as a read-only file.
func quietError(op, path string, err error) error {
	switch {
	case errors.Is(err, ErrHotJournal) || isHotJournal(err):
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Advice: hotJournalAdvice,
			Err: fmt.Errorf("%s-journal: %w", path, ErrHotJournal)}
	case errors.Is(err, ErrWALWithoutIndex):
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: err, Advice: walWithoutIndexAdvice}
	}
	return FormatError(op, err)
}

// isHotJournal reports whether err is SQLite's refusal to read a file
// whose journal is hot on a connection that may not roll it back
// (SQLITE_READONLY_ROLLBACK).
func isHotJournal(err error) bool {
	var serr *sqlite.Error
	return errors.As(err, &serr) && serr.Code() == sqlite3.SQLITE_READONLY_ROLLBACK
}

// shmGone reports whether err is SQLite's failure to open a -shm file
// that existed when the access was chosen: the last process that had the
// store open closed it meanwhile, removing -wal and -shm. Looking again
// finds the store closed.
func shmGone(err error) bool {
	var serr *sqlite.Error
	return errors.As(err, &serr) && serr.Code()&0xff == sqlite3.SQLITE_CANTOPEN
}

// readOnlyShmTransient reports whether err is one of SQLite's refusals to
// read through a read-only -shm that last only while a process that has
// the database open recovers or resets its index (SQLITE_READONLY_CANTINIT,
// SQLITE_READONLY_RECOVERY, SQLITE_BUSY_RECOVERY): read again.
func readOnlyShmTransient(err error) bool {
	var serr *sqlite.Error
	if !errors.As(err, &serr) {
		return false
	}
	switch serr.Code() {
	case sqlite3.SQLITE_READONLY_CANTINIT, sqlite3.SQLITE_READONLY_RECOVERY, sqlite3.SQLITE_BUSY_RECOVERY:
		return true
	}
	return false
}
