// Package application implements the lock rules on the domain package and
// on ports declared here (LockRepository, Clock, Observer, Wakeups,
// Processes, PlanStore), never on a database: they run on every adapter.
package application
