//go:build !unix

package sqlite

import (
	"io/fs"
	"os"
)

// dirWritable cannot ask without trying on this system, and trying would
// create a file; the check of the database file itself has to do.
func dirWritable(string) error { return nil }

// fileWritable reads the file's permission bits (its read-only attribute,
// on Windows) rather than opening it: a descriptor opened and closed here
// could cost the locks of SQLite's own on some system. What the bits do
// not show (an access list) SQLite reports at the first write.
func fileWritable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o200 == 0 {
		return &fs.PathError{Op: "write", Path: path, Err: fs.ErrPermission}
	}
	return nil
}

// fileReadable leaves it to SQLite, whose error says less, to find a file
// it cannot read: the permission bits of this system have no such bit.
func fileReadable(string) error { return nil }

// readOnlyMount cannot tell on this system; the permission bits have to do.
func readOnlyMount(string) bool { return false }

// ownerOrRoot has no owner to compare with on this system.
func ownerOrRoot(fs.FileInfo) error { return nil }
