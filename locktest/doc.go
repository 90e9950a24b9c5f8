// Package locktest checks that a lock store keeps every promise of
// application.LockRepository, the port that the lock service
// (application.LockService) runs on. It is to a lock store what
// testing/fstest.TestFS is to a file system: one call, from a test of the
// store's own package, runs the whole contract, and every promise the
// store breaks fails a subtest named for it.
//
//	func TestStore(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) application.LockRepository {
//			return mystore.New() // a new, empty store for each subtest
//		})
//	}
//
// Every store of this module (memory, SQLite, PostgreSQL) passes it in
// go test ./..., and so must a store of one's own before it is trusted to
// keep two holders apart. docs/adapters.md walks through writing one.
//
// # What it checks
//
// Run drives a real application.LockService over the store, on a
// *clock.Mock (github.com/benbjohnson/clock) set to Start and moved
// across every expiry boundary, so that each rule of the service is
// checked on the store, not only its plumbing. No subtest sleeps to wait
// for an expiry. The top-level subtests are:
//
//   - Acquire, Renew, Release, ReleaseAllForOwner, CleanupExpired,
//     StaleCount, GetAndList, FencingToken, Validation: every rule of the
//     service, at the microsecond before, at and after each expiry (a lock
//     is active strictly before ExpiresAt), with the holder named in each
//     refusal, nothing written on a refusal, and fencing tokens that only
//     grow, even after the store empties (they need not start at 1 nor be
//     consecutive). A renewal with a shorter TTL shortens the lock (the
//     new expiry is now+ttl); a re-entry with a shorter TTL never does
//     (the later of the two expiries stands).
//   - Concurrency: sixteen owners race for one resource and exactly one
//     wins; eight workers hand a resource over two hundred times, two
//     are never inside at once, and each holder's token is larger than
//     every earlier holder's (not only than the tokens its own goroutine
//     drew); Get, List and CountExpired read while
//     others write; eight resources change hands at once and no token is
//     handed out twice, nor a smaller one after a larger on a resource.
//   - Repository: the port's own promises, without the service: Update
//     returns its Decide function's error unchanged and rolls back on a
//     panic (a store still locked after it fails within seconds, not at
//     go test's timeout), returns the lock as stored (in UTC), a
//     ChangeExtend stores the expiry given, earlier or later; a Decide
//     that changes nothing (ChangeNone) is given the lock as stored and
//     gets it back unchanged (the zero Lock when there is none), and
//     nothing is written; DeleteExpired removes at most limit locks, and
//     fewer only when no more have expired (a store that keeps reporting
//     full batches fails the service's purge with an error saying so,
//     rather than keep it looping); a context that ended before a write, or
//     mid-write, is the context's error and writes nothing; List orders
//     ids by their bytes.
//   - OneStatement: the optional port application.OneStatement, each of
//     its rules (Acquire, Take, Renew, RenewToken) put through ten states
//     of a resource and compared with the Go rule it replaces (Op.Decide:
//     DecideAcquire, DecideTake, DecideRenew, DecideRenewToken); a
//     re-entry must never shorten the lock (the caller's own lock that
//     outlives now+ttl keeps its expiry). They skip, saying so, for a
//     store that does not implement the port, or leaves a rule's plainest
//     case (a free resource, the caller's own active lock) to Update.
//   - DeadHolder: a lock that changes hands while the dead-holder probe
//     runs is not taken over.
//   - Handles: writes by an acquisition's token never touch another
//     acquisition of the same owner.
//   - ExactBytes: owners and resource ids are exact byte strings: "Alice"
//     never releases, re-enters, renews or lists "alice"'s lock, nor
//     "worker-1" "worker-12"'s; "Deploy" and "deploy", "p1" and "p1 ", an
//     id in NFC and in NFD are different resources.
//   - EndedContext: every write of the service (Acquire, Take, Renew, a
//     handle's Renew, Release, ReleaseAllForOwner, CleanupExpired) with a
//     context cancelled or past its deadline before the call returns the
//     context's error and writes nothing, through whichever ports the
//     store implements.
//   - Note: the note of a new lock (Change.Lock.Note, Op.Note) is stored
//     and read back by Get and List, whatever path wrote it; a re-entry
//     or renewal keeps it; a refusal names it in the holder and its
//     message; a note past domain.MaxNoteBytes, or not on one line, is
//     refused before any write.
//
// No call hangs the suite: a subtest that has not returned in 30 s (60 s
// under -race; the time its own subtests take is theirs) fails with
// "stuck", the likely cause (a lock or mutex not released on an error
// path, or a call that ignores its context) and the stacks of the calls
// that wait, and ends, leaving its goroutines blocked; once one has hung,
// the rest of the test binary's subtests have 3 s each (under -race too).
//
// A OneStatement store may leave some cases to Update, by returning
// ChangeNone and no error. One that leaves none of an acquire or a take,
// and no extension but one within a second of its lock's expiry, says so
// with a method DecidesAll(), and Run then holds it to that.
//
// # Using it
//
// NewRepository must return a new, empty store each time: Run calls it
// for every subtest. The store must be safe for concurrent use (the
// Concurrency subtests call it from many goroutines at once). A store
// over a database gives each call a database (or schema) of its own, and
// closes it with t.Cleanup.
//
// Run the suite with go test -race. A store that reads without the lock
// its writes take, or shares a token counter between writers without
// one, may still give right answers while the suite watches: with -race
// the Concurrency subtests report it as a data race, without it they
// catch it only by luck.
//
// The package takes a *testing.T and reports with
// github.com/stretchr/testify, a dependency of this module already: it is
// for the _test.go files of a store, and a program that imports only the
// lock module's root package links neither it nor testify.
package locktest
