package sqlite

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// createFile makes an empty file with mknod(2), which opens no descriptor whose
// close would drop SQLite's locks; a file system without it (FUSE) gets createOpen.
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

// syncWALFileSystem syncs the WAL's file system, the database's pages among
// them. Closing a descriptor of the WAL is safe: SQLite never locks it.
func syncWALFileSystem(walPath string) error {
	f, err := os.Open(walPath)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
