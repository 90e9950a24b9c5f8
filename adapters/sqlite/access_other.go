//go:build !unix

package sqlite

import (
	"io/fs"
	"os"
)

// dirWritable cannot ask without trying on this system, and trying would
// create a file; the check of the database file itself has to do.
func dirWritable(string) error { return nil }

// fileWritable tries to open the file at path for writing. Closing the
// descriptor leaves the locks of other handles in place on this system.
func fileWritable(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// readOnlyMount cannot tell on this system; the permission bits have to do.
func readOnlyMount(string) bool { return false }

// ownerOrRoot has no owner to compare with on this system.
func ownerOrRoot(fs.FileInfo) error { return nil }
