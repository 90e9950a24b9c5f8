package sqlite

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// SideFileError reports that something other than the store's own file
// is at the name of one of its side files ("-lock", "-wake", or SQLite's
// "-journal", "-wal", "-shm"): a symbolic link, a FIFO, a file with more
// than one name, or one of a user who could not write the database.
// Another local user may have planted it: using it would write or lock a
// file elsewhere, read that user's commits, or block on a FIFO. It comes
// wrapped in a *domain.StoreError (StoreUnreachable); match it with
// errors.As.
type SideFileError struct {
	// Path is the side file's name.
	Path string
	// Problem says what is there instead.
	Problem string
}

func (e *SideFileError) Error() string {
	return fmt.Sprintf("%s %s: it must be a regular file of the lock store's own", e.Path, e.Problem)
}

// sideFileAdvice is what to do about a SideFileError at "-lock" or
// "-wake".
const sideFileAdvice = "remove it (it holds no data, and the store creates it again) once you know who put it there; " +
	"if another user could, keep the database in a directory that only its users can write"

// sqliteSideFileAdvice is what to do about a SideFileError at one of
// SQLite's own side files, which a regular file there may hold commits
// of the database in.
const sqliteSideFileAdvice = "a FIFO, a symbolic link or a directory there is not SQLite's: remove it once you know who put it there; " +
	"a regular file there (with other names, or of another user) may hold commits of the database: do not remove it, " +
	"but have the database's owner open the database once with sqlite3, after which SQLite removes it; " +
	"if another user could put it there, keep the database in a directory that only its users can write; the database was left as it was"

// advice is what to do about e.
func (e *SideFileError) advice() string {
	for _, suffix := range sqliteSideFiles {
		if strings.HasSuffix(e.Path, suffix) {
			return sqliteSideFileAdvice
		}
	}
	return sideFileAdvice
}

// sqliteSideFiles are the suffixes of the side files that SQLite itself
// opens beside a database: its rollback journal, its write-ahead log and
// the log's index. SQLite opens them without a question: it blocks for
// ever on a FIFO there (the journal is opened to read its first byte
// whenever it exists), and reads whatever file is there.
var sqliteSideFiles = []string{"-journal", "-wal", "-shm"}

// sideFileProblem says what is wrong with fi, which lstat(2) or fstat(2)
// returned for a side file of the database whose owner is db, or "" when
// the store may use it: a regular file with one name, of a user who may
// write the database (foreignOwner).
func sideFileProblem(fi fs.FileInfo, db dbOwner) string {
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		return "is a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "is a FIFO (named pipe)"
	case m.IsDir():
		return "is a directory"
	case !m.IsRegular():
		return fmt.Sprintf("is not a regular file (mode %s)", m.Type())
	case linkCount(fi) > 1:
		return fmt.Sprintf("has %d names (hard links)", linkCount(fi))
	}
	return foreignOwner(fi, db)
}

// checkSideFile refuses what is at the name of the side file path of the
// database db when the store may not use it (sideFileProblem). It only
// looks (lstat), so that Open can refuse before it creates or writes the
// database; a missing file is fine (the store creates it).
func checkSideFile(db, path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil // missing, or for the open to report
	}
	if p := sideFileProblem(fi, ownerOf(db)); p != "" {
		return &SideFileError{Path: path, Problem: p}
	}
	return nil
}

// checkSQLiteSideFiles refuses SQLite's own side files of the database
// at path (named by sidePath) when the store may not use them
// (checkSideFile), before SQLite opens them; the pools call it before
// each connection (sideFileConnector). What is planted between the check
// and SQLite's open is not seen.
func checkSQLiteSideFiles(path string) error {
	for _, suffix := range sqliteSideFiles {
		if err := checkSideFile(path, path+suffix); err != nil {
			return err
		}
	}
	return nil
}

// checkSideFiles refuses the side files of the database at path (named
// by sidePath) that the store would open here and must not use
// (checkSideFile): SQLite's own (checkSQLiteSideFiles) and the store's.
// Opening each of the store's checks again, on the file opened, since one
// may be planted between the two.
func checkSideFiles(path string) error {
	if err := checkSQLiteSideFiles(path); err != nil {
		return err
	}
	var names []string
	if haveFileLocks {
		names = append(names, path+"-lock")
	}
	if haveWakeFile {
		names = append(names, path+"-wake")
	}
	for _, name := range names {
		if err := checkSideFile(path, name); err != nil {
			return err
		}
	}
	return nil
}

// openSideFile opens the side file name of the database db with flag
// (os.O_RDONLY or os.O_RDWR, with or without os.O_CREATE; perm for a new
// file), without following a symbolic link or waiting on a FIFO
// (sideFileFlags), and refuses (a *SideFileError) what checkSideFile
// refuses, having changed nothing: lstat before the open cannot see what
// is put there between the two.
func openSideFile(db, name string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|sideFileFlags, perm)
	if err != nil {
		// ELOOP for a symbolic link on Linux (EMLINK, EFTYPE on some
		// BSDs), EISDIR for a directory opened for writing: say what is
		// there rather than the errno.
		if cerr := checkSideFile(db, name); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		if p := sideFileProblem(fi, ownerOf(db)); p != "" {
			err = &SideFileError{Path: name, Problem: p}
		}
	}
	if err != nil {
		f.Close() // a FIFO opened without blocking, or a file left as it was
		return nil, err
	}
	return f, nil
}

// sidePath returns the name on which the side files of the database at
// path are made, and which the store's connections open: absolute (a
// chdir moves nothing) and with symbolic links resolved as SQLite
// resolves them for -wal and -shm, so that every name leads to one set of
// side files. Where the file does not exist yet, its directory is resolved.
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

// withPath returns dsn, made by DSN, naming the file path instead: the
// store's connections are opened one by one as they are needed, and a
// relative name would reach another file after a chdir. Only a path from
// the root of a Unix file system is put in a URI this way (Windows's
// drive letters are left to the DSN as it was given).
func withPath(dsn, path string) string {
	if !strings.HasPrefix(path, "/") {
		return dsn
	}
	_, query, _ := strings.Cut(dsn, "?")
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + query
}
