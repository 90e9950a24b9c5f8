package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// SideFileError reports that something other than the store's own file
// is at the name of one of its side files: a symbolic link, a FIFO or
// another kind of file, or a file with more than one name. Following it
// would create or lock a file somewhere else, or block for ever on a
// FIFO. It comes wrapped in a *domain.StoreError (kind StoreUnreachable),
// so it matches domain.ErrUnavailable too; match it with errors.As.
type SideFileError struct {
	// Path is the side file's name.
	Path string
	// Problem says what is there instead.
	Problem string
}

func (e *SideFileError) Error() string {
	return fmt.Sprintf("%s %s: it must be a regular file of the lock store's own", e.Path, e.Problem)
}

// sideFileAdvice is what to do about a SideFileError.
const sideFileAdvice = "remove it (it holds no data, and the store creates it again) once you know who put it there; " +
	"if another user could, keep the database in a directory that only its users can write"

// sideFileProblem says what is wrong with fi, which lstat(2) or fstat(2)
// returned for a side file's name, or "" when it is a regular file with
// one name.
func sideFileProblem(fi fs.FileInfo) string {
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		return "is a symbolic link"
	case !m.IsRegular():
		return fmt.Sprintf("is not a regular file (mode %s)", m.Type())
	case linkCount(fi) > 1:
		return fmt.Sprintf("has %d names (hard links)", linkCount(fi))
	}
	return ""
}

// checkSideFile refuses what is at the name of the side file path when it
// is not a regular file with one name. It only looks (lstat), so that Open
// can refuse before it writes the database; a missing file is fine (the
// store creates it).
func checkSideFile(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil // missing, or for the open to report
	}
	if p := sideFileProblem(fi); p != "" {
		return &SideFileError{Path: path, Problem: p}
	}
	return nil
}

// openSideFile opens (creating it with mode perm if missing) the side file
// path for reading, without following a symbolic link or waiting on a
// FIFO (sideFileFlags), and refuses what checkSideFile refuses: lstat
// before the open cannot see what is put there between the two.
func openSideFile(path string, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|sideFileFlags, perm)
	if errors.Is(err, syscall.ELOOP) {
		return nil, &SideFileError{Path: path, Problem: "is a symbolic link"}
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		if p := sideFileProblem(fi); p != "" {
			err = &SideFileError{Path: path, Problem: p}
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
