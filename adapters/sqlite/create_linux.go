package sqlite

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// createFile creates an empty regular file at path with mode perm (less
// the umask), failing with fs.ErrExist when something is there already. It
// is mknod(2), which makes the file without opening it: no descriptor of
// the database file is ever opened, and so none is closed, outside SQLite.
// A file system that cannot make files that way (some FUSE ones) gets the
// file opened with O_EXCL and closed at once, which is safe as long as no
// other goroutine of this process opens the same new file in the same
// microseconds.
func createFile(path string, perm fs.FileMode) error {
	err := unix.Mknod(path, unix.S_IFREG|uint32(perm.Perm()), 0)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			return err
		}
		return f.Close()
	}
	if err != nil {
		return &fs.PathError{Op: "create", Path: path, Err: err}
	}
	return nil
}
