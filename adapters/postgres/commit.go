package postgres

// releaseCommit, evaluated by every release statement, turns
// synchronous_commit off for its transaction: the commit returns once
// visible, without waiting for the disk flush, its whole cost on most
// disks (and notifying commits run one at a time). Only a release may: a
// forgotten acquire or renewal could let a second holder in, a forgotten
// release only brings its lock back to expire, for no one, and the next
// acquire's flush (or the WAL writer, within 600 ms) covers it.
const releaseCommit = "set_config('synchronous_commit', 'off', true)"
