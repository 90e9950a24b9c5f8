package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/cleveragents/locks/domain"
)

// LinkedFileError reports a database file that has more than one name
// (hard links). SQLite keeps a database's journal, its -wal and -shm
// files, beside the name it was opened by, so each name is a database of
// its own over the same pages: two processes that open the file by two
// names both grant the same lock, with the same token, and the file ends
// up corrupt. The store refuses such a file before SQLite opens it. It
// comes wrapped in a *domain.StoreError (kind StoreUnreachable), so it
// matches domain.ErrUnavailable too; match it with errors.As.
type LinkedFileError struct {
	// Path is the name the store was given.
	Path string
	// Links is how many names (hard links) the file had.
	Links uint64
}

func (e *LinkedFileError) Error() string {
	return fmt.Sprintf("%s has %d names (hard links) for one file: SQLite keeps a database's journal (its -wal and -shm files) "+
		"by name, so two names are two databases, and two processes could both hold the same lock", e.Path, e.Links)
}

// linkedFileAdvice says what to do about a LinkedFileError for path.
func linkedFileAdvice(path string) string {
	return "use one name for the database file in every program that opens it, and remove the other names " +
		"(find them with: find / -xdev -samefile " + path + ")"
}

// checkOneName refuses a database file with more than one name (see
// LinkedFileError). It follows a symbolic link, as SQLite does (the
// journal then lives beside the link's target, whose name is one), and
// looks only with stat(2): opening the file would mean closing a
// descriptor of it, which drops the POSIX locks that SQLite connections of
// this process hold on it. A missing file has no other name.
//
// Every opener checks, so a name linked while the store is open is refused
// to whoever opens the file next, by any of its names.
func checkOneName(op, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil // a missing or unreadable file: the open reports it
	}
	if n := linkCount(fi); n > 1 {
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Advice: linkedFileAdvice(path),
			Err: &LinkedFileError{Path: path, Links: n}}
	}
	return nil
}

// ReplacedFileError reports that the name a store was opened by no longer
// names the file it has open: the file was removed, renamed, or replaced
// by another. A process that opens the name now gets another database (a
// new, empty one where nothing is left), or the same pages with a journal
// of its own, and could grant the locks this store holds; so the store
// writes no more. It comes wrapped in a *domain.StoreError (kind
// StoreUnreachable, marked Permanent: a keep-alive that meets it ends its
// hold at once); match it with errors.As.
type ReplacedFileError struct {
	// Path is the name the store was opened by.
	Path string
	// Removed: the name names no file now (otherwise another file).
	Removed bool
}

func (e *ReplacedFileError) Error() string {
	now := "names another file"
	if e.Removed {
		now = "names no file"
	}
	return fmt.Sprintf("%s %s now: the database file the store opened was removed, renamed or replaced while it was open, "+
		"so processes that open %s now use another database", e.Path, now, e.Path)
}

// replacedAdvice is what to do about a ReplacedFileError.
const replacedAdvice = "close the store and open the store again by the database's name as it is now, " +
	"in every process that had it open, and move a lock database only while no process has it open"

// checkFile refuses to write when the store's name no longer names the
// file it opened (see ReplacedFileError). It runs before each write
// transaction, as this process's writer, and costs one stat(2). A second
// name alone does not stop the processes that have the file open: each
// new opener refuses it (checkOneName), and a backup made with hard links
// (cp -al, rsnapshot) must not stop a running service.
func (db *DB) checkFile() error {
	if db.file == nil {
		return nil
	}
	fi, err := os.Stat(db.abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &ReplacedFileError{Path: db.path, Removed: true}
	case err != nil:
		return nil // not this check's to judge: SQLite reports what it meets
	case !os.SameFile(fi, db.file):
		return &ReplacedFileError{Path: db.path}
	}
	return nil
}
