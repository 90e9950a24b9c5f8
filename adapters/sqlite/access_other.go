//go:build !unix

package sqlite

import (
	"io/fs"
	"os"
)

// dirWritable cannot ask without trying here, which would create a file.
func dirWritable(string) error { return nil }

// fileWritable tries to open the file for writing, which asks about access
// lists too. On Windows, the one such system SQLite runs on, a lock
// (LockFileEx) belongs to the handle that took it, so closing another
// handle is safe, unlike on Unix (access_unix.go).
func fileWritable(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// These systems cannot tell: SQLite's own errors, the permission bits and
// the other checks have to do.

func fileReadable(string) error                { return nil }
func readOnlyMount(string) bool                { return false }
func ownerOrRoot(fs.FileInfo) error            { return nil }
func linkCount(fs.FileInfo) uint64             { return 1 }
func foreignOwner(fs.FileInfo, dbOwner) string { return "" }
func ownerOf(string) dbOwner                   { return dbOwner{} }

type dbOwner struct{}
