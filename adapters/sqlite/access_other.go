//go:build !unix

package sqlite

import (
	"io/fs"
	"os"
)

// fileWritable opens the file, which asks about access lists too: on
// Windows a lock belongs to the handle that took it, so closing ours is safe.
func fileWritable(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// These systems cannot tell (or, for a directory, not without writing):
// SQLite's errors, the permission bits and the other checks have to do.
func dirWritable(string) error                 { return nil }
func fileReadable(string) error                { return nil }
func readOnlyMount(string) bool                { return false }
func ownerOrRoot(fs.FileInfo) error            { return nil }
func linkCount(fs.FileInfo) uint64             { return 1 }
func foreignOwner(fs.FileInfo, dbOwner) string { return "" }
func ownerOf(string) dbOwner                   { return dbOwner{} }

type dbOwner struct{}
