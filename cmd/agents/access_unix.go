//go:build unix

package main

import "golang.org/x/sys/unix"

// canCreateIn reports whether this process may create a file in dir, as
// the kernel decides it for this user (access(2)).
func canCreateIn(dir string) bool {
	return unix.Access(dir, unix.W_OK|unix.X_OK) == nil
}
