//go:build !linux

package sqlite

// mountRoot cannot tell here without opening the file: a bind mount of a
// single file is a Linux (and container) matter.
func mountRoot(string) bool { return false }
