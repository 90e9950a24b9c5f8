//go:build unix

package sqlite

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// dbOwner is whom the side files of a database may belong to.
type dbOwner struct {
	uid, gid   uint32
	groupWrite bool // the database's group may write it
}

// ownerOf returns the owner of the database at db, or, while it does not
// exist yet, this process (who is about to create it).
func ownerOf(db string) dbOwner {
	var st unix.Stat_t
	if unix.Stat(db, &st) != nil {
		return dbOwner{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}
	}
	return dbOwner{uid: st.Uid, gid: st.Gid, groupWrite: st.Mode&0o020 != 0}
}

// openSideFile opens the side file name of the database at db with flag
// (os.O_RDONLY or os.O_RDWR, with or without os.O_CREATE; perm for a new
// file). It never follows a symbolic link at name, never blocks on it (a
// FIFO), never creates anything but a new regular file, and refuses (a
// *sideFileError) what trustSideFile does not trust, having changed
// nothing.
func openSideFile(db, name string, flag int, perm fs.FileMode) (*os.File, error) {
	fd, err := unix.Open(name, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		// ELOOP for a symbolic link on Linux (EMLINK, EFTYPE on some
		// BSDs), EISDIR for a directory opened for writing: say what is
		// there rather than the errno.
		if cerr := checkSideFile(db, name); cerr != nil {
			return nil, cerr
		}
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	fi, err := f.Stat()
	if err == nil {
		if reason := trustSideFile(fi, ownerOf(db)); reason != "" {
			err = &sideFileError{path: name, reason: reason}
		}
	}
	if err != nil {
		f.Close() // a FIFO opened without blocking, or a file left as it was
		return nil, err
	}
	return f, nil
}

// checkSideFile refuses the side file name of the database at db, if
// something is there that trustSideFile does not trust; a missing file,
// or one that cannot be looked at, is for the open to decide.
func checkSideFile(db, name string) error {
	fi, err := os.Lstat(name)
	if err != nil {
		return nil
	}
	if reason := trustSideFile(fi, ownerOf(db)); reason != "" {
		return &sideFileError{path: name, reason: reason}
	}
	return nil
}

// trustSideFile returns why the side file fi must not be used, or "": it
// must be a regular file (not a symbolic link, through which writes and
// chmods would reach another file, nor a FIFO, whose open or read would
// block), with no other name (a hard link to another file), belonging to
// this user, root, the database's owner, or the database's group if that
// group may write the database (a user who shares it). A file of anyone
// else could be held by them: flocked forever, so that no writer of the
// database gets its turn, or write-locked, so that no waiter's mark takes.
func trustSideFile(fi fs.FileInfo, db dbOwner) string {
	if !fi.Mode().IsRegular() {
		return notRegular(fi.Mode())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	if st.Nlink != 1 {
		return fmt.Sprintf("has %d names (hard links), so it may be another file", st.Nlink)
	}
	euid := uint32(os.Geteuid())
	if st.Uid == euid || st.Uid == 0 || st.Uid == db.uid || db.groupWrite && st.Gid == db.gid {
		return ""
	}
	return fmt.Sprintf("belongs to uid %d, who is neither this user (uid %d), root, nor the database's owner (uid %d) or group",
		st.Uid, euid, db.uid)
}
