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
// exist yet, this process (which is about to create it).
func ownerOf(db string) dbOwner {
	var st unix.Stat_t
	if unix.Stat(db, &st) != nil {
		return dbOwner{uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}
	}
	return dbOwner{uid: st.Uid, gid: st.Gid, groupWrite: st.Mode&0o020 != 0}
}

// foreignOwner says, if so, that the side file fi belongs to a user the
// store must not trust with it: neither this user, root, the database's
// owner, nor (where that group may write the database) its group. Such a
// user could hold the file: flock it for ever, so that no writer of the
// database gets its turn, or write-lock it, so that no waiter's mark
// takes.
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
