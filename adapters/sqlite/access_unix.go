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

// The checks here ask the operating system (faccessat(2)) rather than open
// the file: closing a descriptor of a database file would drop the locks
// that SQLite connections of this process hold on it.

// dirWritable reports whether this process may create and remove files in dir.
func dirWritable(dir string) error {
	return accessError("write in directory", dir, unix.W_OK|unix.X_OK)
}

// fileWritable reports whether this process may write the file at path.
func fileWritable(path string) error { return accessError("write", path, unix.W_OK) }

// fileReadable reports whether this process may read the file at path.
func fileReadable(path string) error { return accessError("read", path, unix.R_OK) }

// readOnlyMount reports whether path is on a file system mounted
// read-only, where not even root can write.
func readOnlyMount(path string) bool {
	return errors.Is(effectiveAccess(path, unix.W_OK), unix.EROFS)
}

func accessError(op, path string, mode uint32) error {
	if err := effectiveAccess(path, mode); err != nil {
		return &fs.PathError{Op: op, Path: path, Err: err}
	}
	return nil
}

// effectiveAccess asks as the effective user: access(2) alone answers for
// the real user, which a setuid or setgid program is not.
func effectiveAccess(path string, mode uint32) error {
	return unix.Faccessat(unix.AT_FDCWD, path, mode, unix.AT_EACCESS)
}

// ownerOrRoot reports an error unless the files this process creates beside
// the database fi end up the database owner's: it runs as the owner, or as
// root, whose files SQLite hands to the owner.
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

// linkCount returns how many names (hard links) the file fi has.
func linkCount(fi fs.FileInfo) uint64 {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 1
	}
	return uint64(st.Nlink) //nolint:unconvert // uint16 on some systems
}

// dbOwner is whom the side files of a database may belong to.
type dbOwner struct {
	uid, gid   uint32
	groupWrite bool // the database's group may write it
}

// ownerOf returns the owner of the database at db, or, while it does not
// exist yet, this process (which is about to create it).
func ownerOf(db string) dbOwner {
	var st unix.Stat_t
	if unix.Stat(db, &st) != nil {
		return dbOwner{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}
	}
	return dbOwner{uid: st.Uid, gid: st.Gid, groupWrite: st.Mode&0o020 != 0}
}

// foreignOwner says, if so, that the side file fi belongs to a user other
// than this one, root, the database's owner or (where it may write the
// database) its group: such a user could flock it for ever, so that no
// writer gets its turn, or write-lock it, so that no waiter's mark takes.
func foreignOwner(fi fs.FileInfo, db dbOwner) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	euid := uint32(os.Geteuid())
	if st.Uid == euid || st.Uid == 0 || st.Uid == db.uid || db.groupWrite && st.Gid == db.gid {
		return ""
	}
	return fmt.Sprintf("belongs to uid %d, who is neither this user (uid %d), root, nor the database's owner (uid %d) or writing group",
		st.Uid, euid, db.uid)
}
