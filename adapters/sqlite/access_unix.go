//go:build unix

package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// dirWritable asks the operating system whether this process may create
// and remove files in dir, without trying it.
func dirWritable(dir string) error {
	if err := effectiveAccess(dir, unix.W_OK|unix.X_OK); err != nil {
		return &fs.PathError{Op: "write in directory", Path: dir, Err: err}
	}
	return nil
}

// fileWritable asks the operating system whether this process may write
// the file at path, without opening it: closing a descriptor of a database
// file would drop the locks that SQLite connections of this process hold
// on it.
func fileWritable(path string) error {
	if err := effectiveAccess(path, unix.W_OK); err != nil {
		return &fs.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// fileReadable asks the operating system whether this process may read
// the file at path, without opening it (see fileWritable).
func fileReadable(path string) error {
	if err := effectiveAccess(path, unix.R_OK); err != nil {
		return &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return nil
}

// readOnlyMount reports whether path is on a file system mounted
// read-only, where not even root can write.
func readOnlyMount(path string) bool {
	return errors.Is(effectiveAccess(path, unix.W_OK), unix.EROFS)
}

// ownerOrRoot reports an error unless the files this process creates beside
// the database that fi describes end up belonging to the database's owner:
// it runs as the owner, or as root, whose files SQLite hands to the owner.
func ownerOrRoot(fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	euid := os.Geteuid()
	if euid == 0 || uint64(euid) == uint64(st.Uid) {
		return nil
	}
	return fmt.Errorf("this user (uid %d) is not the database's owner (uid %d): "+
		"files it created there would keep the owner from writing the database", euid, st.Uid)
}

// effectiveAccess asks whether this process may use path in mode, as its
// effective user: access(2) alone answers for the real user, which a
// setuid or setgid program is not.
func effectiveAccess(path string, mode uint32) error {
	return unix.Faccessat(unix.AT_FDCWD, path, mode, unix.AT_EACCESS)
}

// linkCount returns how many names (hard links) the file fi describes
// has.
func linkCount(fi fs.FileInfo) uint64 {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 1
	}
	return uint64(st.Nlink) //nolint:unconvert // uint16 on some systems
}
