package sqlite

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncWALFileSystem writes out every dirty page of the file system that
// holds the WAL file at walPath, the database file's among them
// (syncfs(2)).
func syncWALFileSystem(walPath string) error {
	f, err := os.Open(walPath)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
