package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/cleveragents/locks/domain"
)

// ErrUntrustedSideFile is matched (errors.Is) by the error of Open when a
// side file of the database, "<database>-lock" or "<database>-wake", is
// something the store did not make and must not use: a symbolic link, a
// FIFO, a directory, a file with other names (hard links) or a file of a
// user who could not write the database. Another local user may have put
// it there to make the store write through it, or hang on it. Open
// refuses it and leaves it, and what it points at, as they are; remove it
// and open again (the store creates its own).
var ErrUntrustedSideFile = errors.New("a side file of the lock store is not one the store can trust")

// sideFileError says which side file is refused, and why.
type sideFileError struct {
	path   string
	reason string
}

func (e *sideFileError) Error() string {
	return fmt.Sprintf("%s %s: the lock store did not make it, and will not use it", e.path, e.reason)
}

// Is makes errors.Is(err, ErrUntrustedSideFile) true.
func (e *sideFileError) Is(target error) bool { return target == ErrUntrustedSideFile }

// sideFileStoreError turns the refusal of a side file into the store's
// error, advising what to do.
func sideFileStoreError(op string, err error) error {
	var se *sideFileError
	if !errors.As(err, &se) {
		return FormatError(op, err)
	}
	return &domain.StoreError{Op: op, Kind: domain.StoreInternal, Err: err,
		Advice: "remove " + se.path + " (another user may have put it there: see who owns it first); " +
			"the lock store creates its own when it opens"}
}

// sidePath returns the name on which the side files of the database at
// path are made: absolute, so that a chdir of the process does not move
// them, and with every symbolic link resolved, as SQLite resolves them
// for its -wal and -shm files, so that every name of the database's
// directory, and a symbolic link to the database, lead to one set of side
// files. Where the file does not exist yet, its directory is resolved.
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

// sideSuffixes are the side files the module makes beside a database.
var sideSuffixes = []string{"-lock", "-wake"}

// checkSideFiles refuses, before anything is created or changed, the side
// files of the database at path (resolved by sidePath) that the store
// must not use (see trustSideFile). Opening each one checks again, on
// the file opened, since one may be planted between the two.
func checkSideFiles(path string) error {
	for _, suffix := range sideSuffixes {
		if err := checkSideFile(path, path+suffix); err != nil {
			return err
		}
	}
	return nil
}

// notRegular names what a side file is when it is not a regular file.
func notRegular(mode fs.FileMode) string {
	switch {
	case mode&fs.ModeSymlink != 0:
		return "is a symbolic link"
	case mode&fs.ModeNamedPipe != 0:
		return "is a FIFO (named pipe)"
	case mode.IsDir():
		return "is a directory"
	case mode&fs.ModeSocket != 0:
		return "is a socket"
	case mode&fs.ModeDevice != 0:
		return "is a device"
	default:
		return "is not a regular file"
	}
}
