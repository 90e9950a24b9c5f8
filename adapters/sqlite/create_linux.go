package sqlite

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// createFile creates an empty regular file at path with mode perm (less
// the umask), failing with fs.ErrExist when something is there already. It
// is mknod(2), which makes the file without opening it: no descriptor of
// the database file is ever opened, and so none is closed, outside SQLite.
func createFile(path string, perm fs.FileMode) error {
	if err := unix.Mknod(path, unix.S_IFREG|uint32(perm.Perm()), 0); err != nil {
		return &fs.PathError{Op: "create", Path: path, Err: err}
	}
	return nil
}
