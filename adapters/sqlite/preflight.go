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

// ErrForeignLocksTable matches the refusal (StoreSchema) of a file with a
// table named locks, in any letter case, that the migration did not create.
var ErrForeignLocksTable = errors.New("the file has a table named locks that the lock store did not create " +
	"(its migration " + MigrationName + " is not recorded)")

// ErrForeignSchemaObject matches the refusal (StoreSchema) of a file with
// objects named as those the migration creates, which would fail on them.
var ErrForeignSchemaObject = errors.New("the file has objects named as those that the lock store's migration " +
	MigrationName + " creates, which it did not create")

// ErrWALWithoutIndex matches the refusal (StoreUnreachable) of a -wal
// without its -shm, which reading would create.
var ErrWALWithoutIndex = errors.New("this -wal file holds commits not yet copied into the file, and the file's -shm file, " +
	"the index by which SQLite reads them, is missing: reading the file would create the -shm file")

const walWithoutIndexAdvice = "if no program has the file open, open it once with the program that made it " +
	"(or with sqlite3, as a user who may write it): SQLite rebuilds the index, and copies the commits into the file when it closes it; " +
	"do not remove the -wal file, which holds them; the file was left as it was"

// ErrHotJournal matches the refusal (StoreUnreachable) of a file whose
// -journal is hot, which SQLite rolls back on a connection that may write.
var ErrHotJournal = errors.New("a program stopped in the middle of a transaction on the file: " +
	"this -journal file holds what is to be rolled back before the file can be read")

const hotJournalAdvice = "open the file with the program that wrote it (or with sqlite3, as a user who may write it), " +
	"which rolls the transaction back; do not remove the -journal file, without which the file stays half-written; " +
	"the lock store rolls back no file it has not proved to be its own, and left this one as it was"

const foreignLocksAdvice = "point the service at a lock database of its own (a path where no file exists yet creates one), " +
	"and leave this file to the application that made it; the file was left as it was"

// preflight finds, by reading only, every reason to refuse the file at path
// before the journal switch, the version table or a migration writes it.
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

// Reads are repeated while the file changes or its -shm is recovered, and a while for a
// -journal or a lone -wal: a writer's for milliseconds, a stopped program's for good.
const (
	quietAttempts      = 5
	hotJournalPatience = 2 * time.Second
)

func quietPause(attempt int) time.Duration {
	return min(time.Duration(attempt)*10*time.Millisecond, 50*time.Millisecond)
}

// quietRead runs read on one connection to the non-empty database at path
// that changes no file: nothing written, created, rolled back or checkpointed.
func quietRead(ctx context.Context, op, dsn, path string, read func(*sql.DB) error) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		patient := time.Since(start) < hotJournalPatience
		before, _ := os.Stat(path)
		wal, err := readHeader(ctx, op, dsn, path)
		if isCorrupt(err) && changedMeanwhile(path, before) != nil {
			err = errChangedMeanwhile // read alone while a writer was at work
		}
		var acc access
		switch {
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
			// Read alone, it may have been half-written by an opener.
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

var errChangedMeanwhile = errors.New("changed while it was read")

// changedMeanwhile: the file at path is not as before a read, or has a -wal.
func changedMeanwhile(path string, before os.FileInfo) error {
	after, _ := os.Stat(path)
	wal, _ := fileSize(path + "-wal")
	if wal <= 0 && os.SameFile(before, after) && before.Size() == after.Size() && before.ModTime().Equal(after.ModTime()) {
		return nil
	}
	return errChangedMeanwhile
}

// quietAccess reads a file without a -wal alone (and again if it changed).
func quietAccess(path string, wal bool) (access, error) {
	if acc, decided, err := walAccess(path, wal); decided || err != nil {
		return acc, err
	}
	// Left by a journal switch that stopped half-way.
	if n, _ := fileSize(path + "-journal"); n > 0 {
		return access{}, hotJournal(path)
	}
	return access{mode: "ro", immutable: true}, nil
}

// walAccess is the choice quietAccess and readAccess share: mode=ro outside
// WAL mode, through a read-only -shm beside a -wal; undecided without either.
func walAccess(path string, wal bool) (acc access, decided bool, err error) {
	if !wal {
		return access{mode: "ro"}, true, nil
	}
	walSize, err := fileSize(path + "-wal")
	var shmSize, walNow int64
	if err == nil {
		shmSize, err = fileSize(path + "-shm")
	}
	if err == nil {
		walNow, err = fileSize(path + "-wal")
	}
	switch {
	case err != nil:
		return access{}, true, err
	case walSize >= 0 && shmSize >= 0:
		return access{mode: "ro", readOnlyShm: true}, true, nil
	case walNow > 0: // an empty one is left by a reader as the last process closed the store
		return access{}, true, fmt.Errorf("%s-wal: %w", path, ErrWALWithoutIndex)
	}
	return access{}, false, nil
}

func hotJournal(path string) error { return fmt.Errorf("%s-journal: %w", path, ErrHotJournal) }

// quietError tells a hot journal and a -wal without -shm as such, not as read-only.
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

func isHot(err error) bool { return errors.Is(err, ErrHotJournal) || isHotJournal(err) }

// isHotJournal: SQLite refuses to read a hot journal it may not roll back.
func isHotJournal(err error) bool { return sqliteCode(err) == sqlite3.SQLITE_READONLY_ROLLBACK }

func isCorrupt(err error) bool {
	return slices.Contains([]int{sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}, sqliteCode(err)&0xff)
}

// shmGone: the last process closed the store (removing -wal and -shm)
// after the access was chosen; looking again finds it closed.
func shmGone(err error) bool { return sqliteCode(err)&0xff == sqlite3.SQLITE_CANTOPEN }

// readOnlyShmTransient: refusals to read through a read-only -shm that last
// while the process that has the database open recovers its index.
func readOnlyShmTransient(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_READONLY_CANTINIT || c == sqlite3.SQLITE_READONLY_RECOVERY || c == sqlite3.SQLITE_BUSY_RECOVERY
}
