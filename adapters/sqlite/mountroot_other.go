//go:build !linux

package sqlite

import "os"

// mountRoot cannot tell here without opening the file: a bind mount of a
// single file is a Linux (and container) matter.
func mountRoot(string) bool { return false }

// mountRootFile cannot tell here either.
func mountRootFile(*os.File) bool { return false }
