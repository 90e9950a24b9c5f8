package postgres

// releaseCommit turns synchronous_commit off for a release's transaction,
// sparing the disk flush: a release lost in a crash only brings its lock
// back to expire, whereas a lost acquire or renewal could admit two holders.
const releaseCommit = "set_config('synchronous_commit', 'off', true)"
