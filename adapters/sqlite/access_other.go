//go:build !unix

package sqlite

import (
	"io/fs"
	"os"
)

// dirWritable cannot ask without trying on this system, and trying would
// create a file; the check of the database file itself has to do.
func dirWritable(string) error { return nil }

// fileWritable tries to open the file at path for writing, which asks
// about access lists too. On Windows, the one such system SQLite runs on,
// that is safe while SQLite has the file open: a lock (LockFileEx) belongs
// to the handle that took it, and closing another handle leaves it in
// place, unlike a POSIX lock, which closing any descriptor of the file
// drops (access_unix.go).
func fileWritable(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// fileReadable leaves a file this process cannot read to SQLite's own
// error on this system.
func fileReadable(string) error { return nil }

// readOnlyMount cannot tell on this system; the permission bits have to do.
func readOnlyMount(string) bool { return false }

// ownerOrRoot has no owner to compare with on this system.
func ownerOrRoot(fs.FileInfo) error { return nil }

// linkCount cannot tell on this system: a file counts as having one name.
func linkCount(fs.FileInfo) uint64 { return 1 }
