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

// These ask (faccessat(2)) rather than open the file: closing a descriptor
// of the database would drop the locks of this process's connections.
// Every fs.FileInfo here is os's, whose Sys is a *syscall.Stat_t.

func dirWritable(dir string) error {
	return accessError("write in directory", dir, unix.W_OK|unix.X_OK)
}
func fileWritable(path string) error { return accessError("write", path, unix.W_OK) }
func fileReadable(path string) error { return accessError("read", path, unix.R_OK) }

// readOnlyMount reports whether not even root can write path.
func readOnlyMount(path string) bool { return errors.Is(effectiveAccess(path, unix.W_OK), unix.EROFS) }

func accessError(op, path string, mode uint32) error {
	if err := effectiveAccess(path, mode); err != nil {
		return &fs.PathError{Op: op, Path: path, Err: err}
	}
	return nil
}

// effectiveAccess answers for the effective user (a setuid program's).
func effectiveAccess(path string, mode uint32) error {
	return unix.Faccessat(unix.AT_FDCWD, path, mode, unix.AT_EACCESS)
}

// ownerOrRoot: only the owner, or root (SQLite chowns root's files), creates
// files beside the database fi that the owner can write.
func ownerOrRoot(fi fs.FileInfo) error {
	st := fi.Sys().(*syscall.Stat_t)
	euid := os.Geteuid()
	if euid == 0 || uint64(euid) == uint64(st.Uid) {
		return nil
	}
	return fmt.Errorf("this user (uid %d) is not the database's owner (uid %d): "+
		"files it created there would keep the owner from writing the database", euid, st.Uid)
}

func linkCount(fi fs.FileInfo) uint64 {
	return uint64(fi.Sys().(*syscall.Stat_t).Nlink) //nolint:unconvert // uint16 on some systems
}

// dbOwner is whom the side files of a database may belong to.
type dbOwner struct {
	uid, gid   uint32
	groupWrite bool // the database's group may write it
}

// ownerOf returns the owner of the database at db, or this process until it exists.
func ownerOf(db string) dbOwner {
	var st unix.Stat_t
	if unix.Stat(db, &st) != nil {
		return dbOwner{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}
	}
	return dbOwner{uid: st.Uid, gid: st.Gid, groupWrite: st.Mode&0o020 != 0}
}

// foreignOwner says, if so, that the side file fi belongs to a user other
// than this one, root, the database's owner or writing group: such a user
// could flock it for ever, or write-lock it so that no waiter's mark takes.
func foreignOwner(fi fs.FileInfo, db dbOwner) string {
	st := fi.Sys().(*syscall.Stat_t)
	euid := uint32(os.Geteuid())
	if st.Uid == euid || st.Uid == 0 || st.Uid == db.uid || db.groupWrite && st.Gid == db.gid {
		return ""
	}
	return fmt.Sprintf("belongs to uid %d, who is neither this user (uid %d), root, nor the database's owner (uid %d) or writing group",
		st.Uid, euid, db.uid)
}
