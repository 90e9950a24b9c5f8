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
	// EventAcquired: a free resource was locked (Lock is the new lock).
	EventAcquired EventKind = iota + 1
	// EventReentered: the holder acquired its own active lock again.
	EventReentered
	// EventTakenOver: an expired lock was replaced (Previous is the
	// expired lock, Lock the new one).
	EventTakenOver
	// EventRefused: another owner holds the lock (Previous is the holder).
	EventRefused
	// EventRenewed: the holder extended its lock.
	EventRenewed
	// EventRenewFailed: a renewal failed (Err says why).
	EventRenewFailed
	// EventReleased: a lock was released (HeldFor is known when it was
	// released through a Handle).
	EventReleased
	// EventReleasedAll: an owner's locks were released (Count of them).
	EventReleasedAll
	// EventCleanedUp: expired locks were purged (Count of them).
	EventCleanedUp
	// EventWaited: a Take or Do that waited for the holder ended, with the
	// lock (Lock) or without it (Err, the conflict that ended the wait);
	// Took is the whole wait.
	EventWaited
)

var eventNames = map[EventKind]string{
	EventAcquired: "acquired", EventReentered: "reentered", EventTakenOver: "taken_over",
	EventRefused: "refused", EventRenewed: "renewed", EventRenewFailed: "renew_failed",
	EventReleased: "released", EventReleasedAll: "released_all", EventCleanedUp: "cleaned_up",
	EventWaited: "waited",
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
	// Kind is what happened; an observer switches on it.
	Kind EventKind
	// Owner is the owner the call was made for; empty for a cleanup.
	Owner string
	// Resource is the lock's resource; zero for a release-all and a
	// cleanup, which concern several.
	Resource domain.ResourceRef
	// Lock is the lock as stored after the event, when there is one.
	Lock domain.Lock
	// Previous is the holder that refused the caller, the expired lock
	// that was taken over, or the acquisition that a release through a
	// Handle removed (its token says which).
	Previous *domain.Lock
	// Count is how many locks a release-all or a cleanup removed.
	Count int
	// Took is how long the Acquire call took, waiting for the store
	// included, for the acquire events; a Take or Do that waits for the
	// holder reports each try so, and then the whole wait as EventWaited.
	Took time.Duration
	// HeldFor is how long a lock released through a Handle was held.
	HeldFor time.Duration
	// Err is why a renewal failed, or why a wait ended without the lock.
	Err error
	// DeadHolder marks a takeover of an active lock whose holder, a
	// process of this machine, was gone.
	DeadHolder bool
}

// Observer is told of every lock event: the port through which logs and
// metrics see the service. It is called synchronously after the event, so
// it must be quick and must not call the service back.
type Observer interface {
	// Observe is told of e; ctx is the context of the call that caused it.
	Observe(ctx context.Context, e Event)
}

// WithObserver makes the service report its events to o (nil: to nobody).
func WithObserver(o Observer) Option { return func(s *LockService) { s.observer = o } }

func (s *LockService) observe(ctx context.Context, e Event) {
	if s.observer != nil {
		s.observer.Observe(ctx, e)
	}
}
