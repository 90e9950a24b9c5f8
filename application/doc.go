// Package application implements the rules of the lock service on the
// domain package and on ports declared here (LockRepository, Clock, Observer,
// Wakeups, Processes, PlanStore), never on a database: the same rules run on
// every adapter.
package application
