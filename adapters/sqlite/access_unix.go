//go:build unix

package sqlite

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// dirWritable asks the operating system whether this process may create
// and remove files in dir, without trying it.
func dirWritable(dir string) error {
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return &fs.PathError{Op: "write in directory", Path: dir, Err: err}
	}
	return nil
}
