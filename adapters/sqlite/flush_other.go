//go:build !linux

package sqlite

import "errors"

// syncWALFileSystem is Linux's syncfs(2), which other systems lack: there,
// the pages a purge's catch-ups copy are synced by the first checkpoint
// that completes after it, on the writer.
func syncWALFileSystem(string) error {
	return errors.ErrUnsupported
}
