// Package application implements the rules of the lock service: who may
// acquire, renew and release a lock, when a lock has expired, and when an
// expired lock may be taken over.
//
// It depends on the domain package and on small ports declared here:
// LockRepository, implemented by the storage adapters; Clock and Timers,
// satisfied by github.com/benbjohnson/clock's real and mock clocks;
// Observer, told of every lock event (package adapters/telemetry logs and
// measures them); and PlanStore, the embedder's plans, for
// PlanLifecycleService. It never talks to a database itself, so the same
// rules run unchanged on every adapter.
package application
