// Package application implements the rules of the lock service: who may
// acquire, renew and release a lock, when it has expired, and when it may
// be taken over. It depends on the domain package and on ports declared
// here (LockRepository, Clock, Timers, Observer, Wakeups, Processes,
// PlanStore), never on a database, so the same rules run on every adapter.
package application
