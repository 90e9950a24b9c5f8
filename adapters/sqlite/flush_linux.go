package sqlite

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncWALFileSystem writes out every dirty page of the file system that
// holds the WAL file at walPath, the database file's among them
// (syncfs(2)).
//
// It opens and closes a descriptor of the WAL file, which is safe beside
// SQLite's connections: SQLite takes its POSIX locks on the database and
// -shm files, none on the WAL, and closing a descriptor releases only the
// locks on the file it names.
func syncWALFileSystem(walPath string) error {
	f, err := os.Open(walPath)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
