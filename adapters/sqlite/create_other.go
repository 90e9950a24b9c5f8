//go:build !linux

package sqlite

import (
	"io/fs"
	"os"
)

// createFile creates an empty file at path with mode perm, failing with
// fs.ErrExist when something is there already. These systems make a
// regular file only by opening it (mknod(2) wants root on BSD and macOS),
// so the new file's descriptor is closed at once. On Windows that is
// harmless (a lock belongs to the handle that took it); on BSD and macOS
// no connection can have the new file open yet, unless another goroutine
// of this process opens the same new path in the same microseconds.
func createFile(path string, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	return f.Close()
}
