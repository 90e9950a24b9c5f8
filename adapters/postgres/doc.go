// Package postgres stores locks in PostgreSQL through Ent, shared by every
// process of every host on the same database. It runs the SQLite adapter's
// repository (package entstore) and adds: acquires, takes, renewals and
// releases in one statement each (acquire.go, renew.go, lone.go) and the
// undo of an abandoned acquisition (left.go); a transaction-scoped advisory
// lock per resource, so an acquire's read and write cannot interleave with
// another's; group commit (batch.go, everyMembers); releases that skip the
// WAL flush (commit.go); LISTEN/NOTIFY wake-ups (wake.go); bounded retries
// of serialization failures and deadlocks; and FormatError.
package postgres
