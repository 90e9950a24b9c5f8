//go:build linux

package sqlite

import "golang.org/x/sys/unix"

// mountRoot reports whether path, followed as SQLite follows it, is the
// root of a mount: for a file, a bind mount of that file alone. It asks
// statx(2), which opens nothing (closing a descriptor of the database
// would drop the locks of this process's connections); before Linux 5.8
// the kernel does not say, and it reports false.
func mountRoot(path string) bool {
	var st unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_BASIC_STATS, &st) != nil {
		return false // a missing or unreadable file: the open reports it
	}
	return st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}
