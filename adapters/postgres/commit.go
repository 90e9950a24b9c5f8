package postgres

// releaseCommit is what every statement that releases locks evaluates,
// once per lock it removes: it turns synchronous_commit off for that
// statement's transaction alone, so that its commit returns once it is
// visible to every other transaction, without waiting for the server to
// flush it to disk.
//
// A release may skip the flush where no other write may. An acquire, a
// takeover or a renewal that the server forgot in a crash, after its
// holder was told it holds the lock (until a given expiry), could let a
// second holder in: they wait for the flush. A release that the server
// forgets brings back the lock it removed, as it was, with its owner,
// token and expiry: its resource stays taken until that expiry, for no
// one, which costs time but never gives it to two holders. The window is
// short (the server's WAL writer flushes within three wal_writer_delay,
// 600 ms by default), and the next acquire of the resource closes it: its
// commit waits for its own flush, which covers every commit before it,
// the release included.
//
// The flush is the whole cost of a release's commit on most disks, and a
// release sends a notification (wake.go), which makes the server commit
// notifying transactions one at a time, the flush included: without the
// flush, releases no longer queue behind each other's disk writes.
const releaseCommit = "set_config('synchronous_commit', 'off', true)"
