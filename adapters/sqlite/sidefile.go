package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SideFileError, wrapped in a StoreUnreachable *domain.StoreError, reports
// a side file that is not the store's own regular file: another user may
// have planted it to have the store write or lock elsewhere, or block.
type SideFileError struct {
	Path    string // the side file's name
	Problem string // what is there instead
}

func (e *SideFileError) Error() string {
	return fmt.Sprintf("%s %s: it must be a regular file of the lock store's own", e.Path, e.Problem)
}

const sideFileAdvice = "remove it (it holds no data, and the store creates it again) once you know who put it there; " +
	"if another user could, keep the database in a directory that only its users can write"

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

// sqliteSideFiles are opened by SQLite without a question: it blocks for
// ever on a FIFO, and reads whatever file is there.
var sqliteSideFiles = []string{"-journal", "-wal", "-shm"}

// sideFileError refuses fi, the side file name of the database db, unless
// it is a regular file with one name and a trusted owner.
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

// checkSideFile only looks, so that Open refuses before it writes anything;
// a side file bind-mounted onto another file (a *MountedFileError) is
// another journal, queue or wake file in the mount namespaces that see it.
func checkSideFile(db, path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil // missing, or for the open to report
	}
	if err := sideFileError(db, path, fi); err != nil {
		return err
	}
	if mountRoot(path) {
		return &MountedFileError{Path: path, DB: db}
	}
	return nil
}

// refusedSideFile reports whether err refuses a side file (*SideFileError,
// *MountedFileError): the store must not go on without it.
func refusedSideFile(err error) bool {
	var sfe *SideFileError
	var mfe *MountedFileError
	return errors.As(err, &sfe) || errors.As(err, &mfe)
}

// checkSQLiteSideFiles runs before each connection (sideFileConnector):
// what is planted after it is not seen.
func checkSQLiteSideFiles(path string) error {
	for _, suffix := range sqliteSideFiles {
		if err := checkSideFile(path, path+suffix); err != nil {
			return err
		}
	}
	return nil
}

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

// openSideFile opens the side file name of the database db, following no
// link and waiting on no FIFO, and checks the file it opened (not its name).
func openSideFile(db, name string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|sideFileFlags, perm)
	if err != nil {
		// Say what is there rather than ELOOP or EISDIR.
		if cerr := checkSideFile(db, name); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = sideFileError(db, name, fi)
	}
	if err == nil && mountRootFile(f) {
		err = &MountedFileError{Path: name, DB: db}
	}
	if err != nil {
		f.Close() // a FIFO opened without blocking, or a file left as it was
		return nil, err
	}
	return f, nil
}

// sidePath is the absolute (for a chdir), resolved (as SQLite resolves it for
// -wal and -shm) name of the database, so every name leads to one side file.
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

// withPath returns dsn naming path instead, if it is a Unix absolute path.
func withPath(dsn, path string) string {
	if !strings.HasPrefix(path, "/") {
		return dsn
	}
	_, query, _ := strings.Cut(dsn, "?")
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + query
}
