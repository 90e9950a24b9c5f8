package sqlite

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// createFile creates an empty regular file at path with mode perm (less the
// umask), failing with fs.ErrExist when something is there. mknod(2) opens
// no descriptor of the database file, so none is closed outside SQLite; a
// file system without it (some FUSE ones) gets createOpen.
func createFile(path string, perm fs.FileMode) error {
	err := unix.Mknod(path, unix.S_IFREG|uint32(perm.Perm()), 0)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		return createOpen(path, perm)
	}
	if err != nil {
		return &fs.PathError{Op: "create", Path: path, Err: err}
	}
	return nil
}

// syncWALFileSystem writes out every dirty page of the file system that
// holds the WAL file, the database's among them (syncfs(2)). Closing its
// descriptor of the WAL is safe: SQLite locks only the database and -shm.
func syncWALFileSystem(walPath string) error {
	f, err := os.Open(walPath)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
