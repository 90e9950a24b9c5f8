package application

import (
	"context"
	"time"

	"github.com/cleveragents/locks/domain"
)

// EventKind says what happened to a lock.
type EventKind int

// The events the service reports to its Observer.
const (
	EventAcquired    EventKind = iota + 1 // a free resource was locked
	EventReentered                        // the holder acquired its own active lock again
	EventTakenOver                        // an expired lock (Previous) was replaced
	EventRefused                          // another owner (Previous) holds the lock
	EventRenewed                          // the holder extended its lock
	EventRenewFailed                      // a renewal failed (Err says why)
	EventReleased                         // a lock was released (HeldFor set through a Handle)
	EventReleasedAll                      // an owner's locks were released (Count)
	EventCleanedUp                        // expired locks were purged (Count)
	EventWaited                           // a wait ended, with Lock or Err; Took is the whole wait
	EventLost                             // a keep-alive heard of its loss between renewals (Err; Previous, the acquisition)
)

var eventNames = map[EventKind]string{
	EventAcquired: "acquired", EventReentered: "reentered", EventTakenOver: "taken_over",
	EventRefused: "refused", EventRenewed: "renewed", EventRenewFailed: "renew_failed",
	EventReleased: "released", EventReleasedAll: "released_all", EventCleanedUp: "cleaned_up",
	EventWaited: "waited", EventLost: "lost",
}

// String returns the event's name in logs and metrics ("taken_over").
func (k EventKind) String() string {
	if n, ok := eventNames[k]; ok {
		return n
	}
	return "unknown"
}

// Event is one thing that happened to a lock, for logs and metrics.
type Event struct {
	Kind       EventKind          // what happened
	Owner      string             // the owner the call was made for; empty for a cleanup
	Resource   domain.ResourceRef // zero for a release-all and a cleanup
	Lock       domain.Lock        // the lock as stored after the event, if any
	Previous   *domain.Lock       // the refusing holder, the lock taken over, or a Handle's released or lost
	Count      int                // how many locks a release-all or a cleanup removed
	Took       time.Duration      // one try's time; EventWaited's, the whole wait's
	HeldFor    time.Duration      // how long a lock released through a Handle was held
	Err        error              // why a renewal failed, a wait ended without the lock, or a lock was lost
	DeadHolder bool               // the holder taken over was a gone process of this machine
}

// Observer is told of every lock event, for logs and metrics, synchronously:
// it must be quick and must not call the service back.
type Observer interface {
	// Observe is told of e; ctx is the context of the call that caused it.
	Observe(ctx context.Context, e Event)
}

// WithObserver makes the service report its events to o (nil: to nobody).
func WithObserver(o Observer) Option { return func(s *LockService) { s.observer = o } }
