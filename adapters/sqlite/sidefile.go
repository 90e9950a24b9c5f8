package sqlite

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SideFileError reports that something other than the store's own file is
// at the name of a side file ("-lock", "-wake", or SQLite's "-journal",
// "-wal", "-shm"): a symbolic link, a FIFO, a file with more than one name,
// or one of a user who could not write the database. Another local user may
// have planted it, to have the store write or lock a file elsewhere, read
// that user's commits, or block on a FIFO. It comes wrapped in a
// *domain.StoreError (StoreUnreachable); match it with errors.As.
type SideFileError struct {
	Path    string // the side file's name
	Problem string // what is there instead
}

func (e *SideFileError) Error() string {
	return fmt.Sprintf("%s %s: it must be a regular file of the lock store's own", e.Path, e.Problem)
}

const sideFileAdvice = "remove it (it holds no data, and the store creates it again) once you know who put it there; " +
	"if another user could, keep the database in a directory that only its users can write"

// sqliteSideFileAdvice: a regular file at one of SQLite's side files may
// hold commits of the database.
const sqliteSideFileAdvice = "a FIFO, a symbolic link or a directory there is not SQLite's: remove it once you know who put it there; " +
	"a regular file there (with other names, or of another user) may hold commits of the database: do not remove it, " +
	"but have the database's owner open the database once with sqlite3, after which SQLite removes it; " +
	"if another user could put it there, keep the database in a directory that only its users can write; the database was left as it was"

func (e *SideFileError) advice() string {
	if slices.ContainsFunc(sqliteSideFiles, func(suffix string) bool { return strings.HasSuffix(e.Path, suffix) }) {
		return sqliteSideFileAdvice
	}
	return sideFileAdvice
}

// sqliteSideFiles are the side files SQLite opens without a question: it
// blocks for ever on a FIFO there (it reads the journal's first byte
// whenever it exists), and reads whatever file is there.
var sqliteSideFiles = []string{"-journal", "-wal", "-shm"}

// sideFileError refuses fi, which lstat(2) or fstat(2) returned for the
// side file name of the database db, unless it is a regular file with one
// name, of a user who may write the database (foreignOwner).
func sideFileError(db, name string, fi fs.FileInfo) error {
	owner := ownerOf(db)
	var problem string
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		problem = "is a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		problem = "is a FIFO (named pipe)"
	case m.IsDir():
		problem = "is a directory"
	case !m.IsRegular():
		problem = fmt.Sprintf("is not a regular file (mode %s)", m.Type())
	case linkCount(fi) > 1:
		problem = fmt.Sprintf("has %d names (hard links)", linkCount(fi))
	default:
		problem = foreignOwner(fi, owner)
	}
	if problem == "" {
		return nil
	}
	return &SideFileError{Path: name, Problem: problem}
}

// checkSideFile refuses what sideFileError refuses at the side file path
// of the database db, only looking (lstat), so that Open can refuse before
// it creates or writes the database. A missing file is fine.
func checkSideFile(db, path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil // missing, or for the open to report
	}
	return sideFileError(db, path, fi)
}

// checkSQLiteSideFiles checks SQLite's side files of the database at path
// (named by sidePath) before SQLite opens them; the pools call it before
// each connection (sideFileConnector). What is planted after it is not seen.
func checkSQLiteSideFiles(path string) error {
	for _, suffix := range sqliteSideFiles {
		if err := checkSideFile(path, path+suffix); err != nil {
			return err
		}
	}
	return nil
}

// checkSideFiles checks the side files of the database at path (named by
// sidePath) that the store would open here: SQLite's and the store's own,
// which openSideFile checks again on the file it opens.
func checkSideFiles(path string) error {
	err := checkSQLiteSideFiles(path)
	if err == nil && haveFileLocks {
		err = checkSideFile(path, path+"-lock")
	}
	if err == nil && haveWakeFile {
		err = checkSideFile(path, path+"-wake")
	}
	return err
}

// openSideFile opens the side file name of the database db with flag
// (O_RDONLY or O_RDWR, maybe O_CREATE with perm) without following a
// symbolic link or waiting on a FIFO (sideFileFlags), and refuses what
// checkSideFile refuses, on the file opened: lstat before the open cannot
// see what is put there between the two.
func openSideFile(db, name string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|sideFileFlags, perm)
	if err != nil {
		// Say what is there rather than ELOOP (EMLINK, EFTYPE on some
		// BSDs) for a symbolic link, or EISDIR for a directory.
		if cerr := checkSideFile(db, name); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = sideFileError(db, name, fi)
	}
	if err != nil {
		f.Close() // a FIFO opened without blocking, or a file left as it was
		return nil, err
	}
	return f, nil
}

// sidePath returns the name on which the database at path's side files are
// made and its connections opened: absolute (a chdir moves nothing), its
// symbolic links resolved as SQLite resolves them for -wal and -shm (or its
// directory's, while it does not exist), so every name leads to one set.
func sidePath(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs))
	}
	return abs
}

// withPath returns dsn, made by DSN, naming the file path instead, so that
// connections opened later reach the same file after a chdir. Only a Unix
// path from the root is put in a URI (Windows's drive letters are left).
func withPath(dsn, path string) string {
	if !strings.HasPrefix(path, "/") {
		return dsn
	}
	_, query, _ := strings.Cut(dsn, "?")
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + query
}
