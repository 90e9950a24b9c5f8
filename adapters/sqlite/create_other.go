//go:build !linux

package sqlite

import (
	"errors"
	"io/fs"
)

// createFile: these systems make a regular file only by opening it
// (mknod(2) wants root on BSD and macOS).
func createFile(path string, perm fs.FileMode) error { return createOpen(path, perm) }

// syncWALFileSystem: syncfs(2) is Linux's. Elsewhere the pages a purge's
// catch-ups copy are synced by the next complete checkpoint, on the writer.
func syncWALFileSystem(string) error { return errors.ErrUnsupported }
