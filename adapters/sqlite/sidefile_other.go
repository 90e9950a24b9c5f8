//go:build !unix

package sqlite

import (
	"io/fs"
	"os"
)

// openSideFile opens the side file name with flag, creating it with perm.
// This system has no symbolic links or FIFOs that another user could plant
// without this user's say (see sidefile_unix.go).
func openSideFile(_, name string, flag int, perm fs.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag, perm)
}

// checkSideFile has nothing to refuse on this system.
func checkSideFile(_, _ string) error { return nil }
