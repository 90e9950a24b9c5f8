package sqlite

import (
	"fmt"
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

// linkedFileAdvice is what to do about a LinkedFileError.
const linkedFileAdvice = "use one name for the database file and remove the other names " +
	"(find them with: find / -xdev -samefile FILE), in every program that opens it"

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
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Advice: linkedFileAdvice,
			Err: &LinkedFileError{Path: path, Links: n}}
	}
	return nil
}
