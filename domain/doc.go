// Package domain holds the vocabulary of the lock service: what a lock is,
// which resources can be locked, the TTL policy, input validation and the
// errors callers match on.
//
// It depends on the standard library only. Every rule that involves time
// takes "now" as an argument, so the same rule gives the same answer in
// production, under a mock clock and inside a storage transaction.
package domain
