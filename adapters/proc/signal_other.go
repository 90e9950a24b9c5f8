//go:build !unix

package proc

// noSuchProcess never proves a process gone where there is no kill(2).
func noSuchProcess(int) bool { return false }
