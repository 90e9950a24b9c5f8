package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// FormatError translates an error of the driver, of Ent or of the file
// system into a *domain.StoreError naming what failed and what to do; the
// context's errors and the domain's own pass through unchanged.
func FormatError(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if _, ok := errors.AsType[*domain.StoreError](err); ok || errors.Is(err, domain.ErrConflict) || errors.Is(err, domain.ErrExpired) ||
		errors.Is(err, domain.ErrValidation) || errors.Is(err, domain.ErrNotFound) {
		return err
	}
	if _, ok := errors.AsType[*ReplacedFileError](err); ok {
		// Permanent: no retry can reach the file by its name again.
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: err, Permanent: true,
			Advice: "close the store and open the store again by the database's name as it is now, " +
				"in every process that had it open, and move a lock database only while no process has it open"}
	}
	if sfe, ok := errors.AsType[*SideFileError](err); ok {
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: err, Advice: sfe.advice()}
	}
	if mfe, ok := errors.AsType[*MountedFileError](err); ok {
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: err, Advice: mfe.advice()}
	}
	if isHotJournal(err) {
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: fmt.Errorf("%w (%w)", ErrHotJournal, err), Advice: hotJournalAdvice}
	}
	if SnapshotConflict(err) {
		return &domain.StaleSnapshotError{Op: op, What: staleSnapshot, Advice: staleSnapshotAdvice, Err: err}
	}
	return &domain.StoreError{Op: op, Kind: kindOf(err), Err: err}
}

// SQLITE_BUSY_SNAPSHOT refuses at once a deferred transaction that read, then
// wrote after another commit (the module's own begin IMMEDIATE; an embedder's may not).
const (
	staleSnapshot = "the transaction read the database before this write, and another connection has written since: " +
		"its snapshot is out of date, and SQLite cannot let it write (the cause is this transaction, not a writer holding the database: waiting does not help)"
	staleSnapshotAdvice = "roll the transaction back and run it again, begun with BEGIN IMMEDIATE: open its connection " +
		"with the lock store's DSN (sqlite.DSN) or with _txlock=immediate, so that it takes the write lock before it reads"
)

// SnapshotConflict reports whether err is SQLITE_BUSY_SNAPSHOT: a write refused
// to a deferred transaction whose snapshot is out of date, such as a late fence.
func SnapshotConflict(err error) bool {
	var serr *sqlite.Error
	return errors.As(err, &serr) && serr.Code() == sqlite3.SQLITE_BUSY_SNAPSHOT
}

func kindOf(err error) domain.StoreErrorKind {
	if errors.Is(err, errWritersBusy) {
		return domain.StoreBusy
	}
	if serr, ok := errors.AsType[*sqlite.Error](err); ok {
		switch serr.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return domain.StoreBusy
		case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
			return domain.StoreReadOnly
		case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
			return domain.StoreCorrupt
		case sqlite3.SQLITE_FULL:
			return domain.StoreFull
		case sqlite3.SQLITE_CANTOPEN:
			return domain.StoreUnreachable
		case sqlite3.SQLITE_ERROR:
			if strings.Contains(serr.Error(), "no such table") || strings.Contains(serr.Error(), "no such column") {
				return domain.StoreSchema
			}
		}
	}
	switch {
	case errors.Is(err, fs.ErrPermission):
		return domain.StoreReadOnly
	case errors.Is(err, fs.ErrNotExist):
		return domain.StoreUnreachable
	}
	return domain.StoreInternal
}

func isDuplicate(err error) bool {
	var serr *sqlite.Error
	return errors.As(err, &serr) && serr.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

// isBusy: another connection held the write lock past the busy timeout.
func isBusy(err error) bool { return err != nil && kindOf(err) == domain.StoreBusy }

// formatError is FormatError for the store's own operations. SQLITE_FULL
// also comes when AUTOINCREMENT has issued its largest rowid, the last
// token: only then is the sequence read, to tell which.
func (db *DB) formatError(op string, err error) error {
	ferr := FormatError(op, err)
	if !domain.IsStoreKind(ferr, domain.StoreFull) {
		return ferr
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var last int64
	qerr := db.sql.QueryRowContext(ctx, "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = ?), 0), "+
		"coalesce((SELECT max(id) FROM "+entlock.Table+"), 0))", entlock.Table).Scan(&last)
	if qerr != nil || last < math.MaxInt64 {
		return ferr
	}
	return &domain.StoreError{Op: op, Kind: domain.StoreTokensExhausted,
		Err: fmt.Errorf("the last token issued is %d, the largest SQLite can store (SQLite reports it as a full database: %w)", last, err)}
}

// LinkedFileError reports a database file with more than one name (hard links),
// which SQLite would give two -wal and -shm files, so two holders of one lock.
// It comes wrapped in a *domain.StoreError (kind StoreUnreachable).
type LinkedFileError struct {
	Path  string // the name the store was given
	Links uint64 // how many names the file had
}

func (e *LinkedFileError) Error() string {
	return fmt.Sprintf("%s has %d names (hard links) for one file: SQLite keeps a database's journal (its -wal and -shm files) "+
		"by name, so two names are two databases, and two processes could both hold the same lock", e.Path, e.Links)
}

// MountedFileError reports a database file, or one of its side files
// (-journal, -wal, -shm, -lock, -wake), that is a mount point of its own, a
// bind mount of the single file (as `docker run -v FILE:FILE` makes): the
// file has another name, outside the mount, and SQLite keeps a database's
// journal (-wal, -shm) by name, as this module keeps its writers' queue,
// wake file and owner claims, so two names are two databases. It comes
// wrapped in a *domain.StoreError of kind StoreUnreachable.
type MountedFileError struct {
	Path string // the name the store was given, or the mounted side file's
	DB   string // the database whose side file Path is; empty when Path is the database
}

func (e *MountedFileError) Error() string {
	if e.DB != "" {
		return fmt.Sprintf("%s, a side file of the database %s, is a mount point of its own (a bind mount of a single file): "+
			"processes that see another file there keep another journal, writers' queue or owner claims of the database, "+
			"so two processes could both hold the same lock", e.Path, e.DB)
	}
	return fmt.Sprintf("%s is a mount point of its own (a bind mount of a single file): the file has another name, beside which SQLite "+
		"keeps another journal (-wal and -shm) and this module another wake file and owner claims, so two names are two databases, "+
		"and two processes could both hold the same lock", e.Path)
}

func (e *MountedFileError) advice() string {
	if e.DB != "" {
		return "mount the directory that holds the database rather than its files, so that the database's side files are the same " +
			"in every mount namespace (findmnt " + e.Path + " shows the mount); the database was left as it was"
	}
	return "mount the directory that holds the database rather than the file, so that its side files are the same " +
		"under every name, and have every program open it by one name (findmnt " + e.Path + " shows the mount)"
}

// checkOneName refuses, for every opener, a database file with more than
// one name: hard links, or a bind mount of the file. It only stat(2)s,
// following a symbolic link as SQLite does: closing a descriptor of the
// file would drop SQLite's POSIX locks.
func checkOneName(op, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil // a missing or unreadable file: the open reports it
	}
	if n := linkCount(fi); n > 1 {
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: &LinkedFileError{Path: path, Links: n},
			Advice: "use one name for the database file in every program that opens it, and remove the other names " +
				"(find them with: find / -xdev -samefile " + path + ")"}
	}
	if mountRoot(path) {
		return FormatError(op, &MountedFileError{Path: path})
	}
	return nil
}

// ReplacedFileError reports that the store's name no longer names its file, so
// that another opener could grant its locks: it writes no more. It comes
// wrapped in a *domain.StoreError (kind StoreUnreachable, Permanent).
type ReplacedFileError struct {
	Path    string // the name the store was opened by
	Removed bool   // the name names no file now (otherwise another file)
}

func (e *ReplacedFileError) Error() string {
	now := "names another file"
	if e.Removed {
		now = "names no file"
	}
	return fmt.Sprintf("%s %s now: the database file the store opened was removed, renamed or replaced while it was open, "+
		"so processes that open %s now use another database", e.Path, now, e.Path)
}
