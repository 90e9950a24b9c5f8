package application

import (
	"context"

	"github.com/cleveragents/locks/domain"
)

// Queue orders the waiters of the processes that share a store, so that
// they take a lock in the order they began to wait. A Wakeups that is
// also a Queue gives it to the service (WithWakeups). Inside a process the
// service orders its own waiters; a Queue only orders them against other
// processes', so a place need not see the places of its own process.
type Queue interface {
	// Join takes a place in ref's queue behind every place another
	// process took before; ahead reports whether a live one is there now.
	// An error means no place: the waiter goes on without the order.
	Join(ctx context.Context, ref domain.ResourceRef) (p Place, ahead bool, err error)
}

// Place is a waiter's place in a Queue.
type Place interface {
	// Ahead counts the places other processes took before this one that
	// live waiters still hold: one that died or left is not counted.
	Ahead(ctx context.Context) (int, error)
	// Leave gives the place up, once. took says the waiter took the lock;
	// if it did not, the waiters behind are woken to try.
	Leave(took bool)
}
