// Package postgres stores locks in PostgreSQL through Ent, for deployments
// that outgrow one machine: every process of every host that opens the
// same database shares the locks. It runs the same repository as the
// SQLite adapter (package entstore); what it adds is its own:
//
//   - acquires, takes, renewals and releases in one statement each
//     (acquire.go, renew.go, lone.go), which repeat the application's
//     rules in SQL, and the undo of an acquisition whose caller left
//     (left.go);
//   - two updates of one resource are kept apart by a transaction-scoped
//     advisory lock on the resource (pg_advisory_xact_lock), so the read
//     and the write of an acquire cannot interleave with another's, while
//     updates of other resources run in parallel;
//   - the acquires, renewals and releases that arrive while another of
//     their kind is in flight share one statement and one commit (group
//     commit, batch.go, off with Options.DisableGroupCommit); which
//     failures of such a batch are every member's is decided here
//     (everyMembers);
//   - releases commit without waiting for the WAL flush, which acquires,
//     takeovers and renewals wait for (commit.go: why a lost release can
//     only keep a resource taken longer, never give it to two holders);
//   - waiters of other processes hear of releases through LISTEN/NOTIFY,
//     and a release notifies only if a process watches its resource
//     (wake.go);
//   - serialization failures and deadlocks are retried a bounded number of
//     times;
//   - driver errors are translated to the domain's in FormatError.
package postgres
