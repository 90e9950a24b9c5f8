// Package filelocks asks, from another process, which POSIX locks a
// process holds on a SQLite database file and its -shm file, for the tests
// that prove the module never drops the locks that SQLite connections of
// the embedding application hold (closing any descriptor of a file drops
// every POSIX lock the process holds on it).
//
// A lock can only be seen from another process: F_GETLK reports no
// conflict with the asking process's own locks. Owners re-executes the
// running test binary, whose init (in this package) answers and exits
// before any test runs; a test package only has to import this one.
//
// It works on Linux only, where the tests that use it run.
package filelocks
