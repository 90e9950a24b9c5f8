// Package hosts runs several client hosts against one PostgreSQL server
// and breaks the network, the processes, the clocks and the server under
// them, on a schedule (issue 24). Each host is the test binary re-executed
// in network, UTS and PID namespaces of its own (Linux, as root); a
// private server (tests/pgserver) sits behind a Toxiproxy per host. The
// hosts record what they believed and did as JSON lines, and a trigger has
// the server log every change of the locks table; Check reads that
// history, the application's tables and the log afterwards and reports
// every broken promise of docs/holding.md, docs/lifecycle.md and
// docs/operations.md, and any history a single correct lock could not
// have produced.
//
// The checker is portable and unit-tested everywhere; the harness itself
// (hosts_linux_test.go) skips, saying why, unless it runs as root on Linux
// with ip(8), unshare(1), LOCKS_TEST_POSTGRES_DSN and PostgreSQL's server
// binaries.
package hosts
