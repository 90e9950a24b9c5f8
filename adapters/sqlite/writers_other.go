//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package sqlite

import "os"

// Without flock, writers queue through SQLite's busy handler alone.
const haveFileLocks, sideFileFlags = false, 0

func lockFile(*os.File) error   { return nil }
func tryLockFile(*os.File) bool { return true }
func unlockFile(*os.File)       {}
