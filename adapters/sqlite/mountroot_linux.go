//go:build linux

package sqlite

import (
	"os"

	"golang.org/x/sys/unix"
)

// mountRoot reports whether path, followed as SQLite follows it, is the
// root of a mount: for a file, a bind mount of that file alone. It asks
// statx(2), which opens nothing (closing a descriptor of the database
// would drop the locks of this process's connections); before Linux 5.8
// the kernel does not say, and it reports false.
func mountRoot(path string) bool {
	return statxMountRoot(unix.AT_FDCWD, path, 0) // a missing or unreadable file: the open reports it
}

// mountRootFile reports whether f, a side file this process opened, is
// the root of a mount. It asks about the descriptor (AT_EMPTY_PATH), so
// that the file checked is the one opened, not what its name names now.
func mountRootFile(f *os.File) bool {
	return statxMountRoot(int(f.Fd()), "", unix.AT_EMPTY_PATH)
}

func statxMountRoot(dirfd int, path string, flags int) bool {
	var st unix.Statx_t
	if unix.Statx(dirfd, path, flags, unix.STATX_BASIC_STATS, &st) != nil {
		return false
	}
	return st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}
