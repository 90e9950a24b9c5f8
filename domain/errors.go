package domain

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Every error the lock service returns matches one of them
// with errors.Is; the typed errors below carry the details.
var (
	// ErrConflict: another owner holds an active lock on the resource.
	ErrConflict = errors.New("lock is held by another owner")
	// ErrExpired: the caller's lock has expired or no longer exists.
	ErrExpired = errors.New("lock has expired")
	// ErrValidation: a parameter was invalid; nothing was written.
	ErrValidation = errors.New("invalid lock parameter")
	// ErrNotFound: there is no lock on the resource.
	ErrNotFound = errors.New("no lock on resource")
	// ErrUnavailable: the lock store could not complete the operation.
	// Match the StoreError kinds below for the cause.
	ErrUnavailable = errors.New("lock store unavailable")
	// ErrClosed: the lock service was closed (the container shut down);
	// nothing was read or written. Open a new container to use locks again.
	ErrClosed = errors.New("lock service is closed; open a new container to take locks again")
)

// LockConflictError reports that Holder holds an active lock on the
// resource the caller asked for.
type LockConflictError struct {
	Holder Lock
	// Now is the instant at which the conflict was decided.
	Now time.Time
	// Waited is how long the caller waited for the lock before giving up
	// (its context or timeout ended); zero for an acquire that did not
	// wait.
	Waited time.Duration
	// Cause is why a wait ended without the lock: the context's error
	// (context.DeadlineExceeded also for a wait's own timeout). Nil for an
	// acquire that did not wait.
	Cause error
	// InProcess says that Holder is a handle of the caller's own lock
	// service, whatever its owner (which may be the caller's): handles
	// exclude each other even where the store would let an owner re-enter.
	InProcess bool
	// Nested says that the caller's context came from the KeepAlive (or
	// Do) of the handle that holds the lock: waiting would wait for itself.
	Nested bool
	// SameOwner says that Holder has the caller's owner id but is another
	// acquisition (an owner-scoped Acquire, another process given the same
	// id, a handle whose release did not complete): a handle never shares
	// a lock it did not take.
	SameOwner bool
	// RowHeld says that Holder's lock has expired but another transaction
	// holds its row (the holder's fenced transaction, docs/lifecycle.md, or
	// a write in flight); it changes hands once that transaction ends.
	RowHeld bool
}

func (e *LockConflictError) Error() string {
	waited := ""
	if e.Waited > 0 {
		waited = fmt.Sprintf(" after waiting %s", roundForHumans(e.Waited))
	}
	if e.Nested {
		return fmt.Sprintf("%s is already held by the handle whose work this call runs in (owner %q, token %d): taking it again would wait for itself; "+
			"use that handle, or pass AcquireOptions.Reentrant to re-enter it", e.Holder.Resource, e.Holder.Owner, e.Holder.Token)
	}
	if e.RowHeld {
		return fmt.Sprintf("%s is still held by owner %q (token %d): its lock expired at %s, but a transaction that holds the lock's row "+
			"(the holder's fenced write, which checked its fence before the expiry) has not ended%s; the lock changes hands once it commits or "+
			"rolls back: wait for it (AcquireOptions.Wait), or ask the holder to end that transaction",
			e.Holder.Resource, e.Holder.Owner, e.Holder.Token, e.Holder.ExpiresAt.UTC().Format(time.RFC3339Nano), waited)
	}
	if e.SameOwner && !e.InProcess {
		return fmt.Sprintf("%s is held by another acquisition of owner %q (token %d, acquired %s, expires %s, in %s)%s: "+
			"an owner-scoped Acquire of that owner, another process given the same owner id, or a handle whose release did not complete; "+
			"a handle never shares it: wait for it (AcquireOptions.Wait), release it with the handle or owner that took it, "+
			"or give each process its own owner id",
			e.Holder.Resource, e.Holder.Owner, e.Holder.Token,
			e.Holder.AcquiredAt.UTC().Format(time.RFC3339Nano), e.Holder.ExpiresAt.UTC().Format(time.RFC3339Nano),
			roundForHumans(e.Holder.Remaining(e.Now)), waited)
	}
	if e.InProcess {
		return fmt.Sprintf("%s is held by another handle of this process (owner %q, token %d, acquired %s, expires %s, in %s)%s; "+
			"wait for it (AcquireOptions.Wait) or release that handle first",
			e.Holder.Resource, e.Holder.Owner, e.Holder.Token,
			e.Holder.AcquiredAt.UTC().Format(time.RFC3339Nano), e.Holder.ExpiresAt.UTC().Format(time.RFC3339Nano),
			roundForHumans(e.Holder.Remaining(e.Now)), waited)
	}
	return fmt.Sprintf("%s is locked by owner %q (acquired %s, expires %s, in %s)%s; wait for it to be released or to expire, or ask the holder to release it",
		e.Holder.Resource, e.Holder.Owner,
		e.Holder.AcquiredAt.UTC().Format(time.RFC3339Nano), e.Holder.ExpiresAt.UTC().Format(time.RFC3339Nano),
		roundForHumans(e.Holder.Remaining(e.Now)), waited)
}

// roundForHumans rounds a duration to what a reader needs: whole seconds
// from a second up, milliseconds below.
func roundForHumans(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *LockConflictError) Is(target error) bool { return target == ErrConflict }

// Unwrap returns why a wait ended, so that errors.Is(err,
// context.DeadlineExceeded) holds for a wait that timed out.
func (e *LockConflictError) Unwrap() error { return e.Cause }

// LockExpiredError reports that the caller tried to renew a lock that has
// expired or is gone. The caller no longer holds the resource and must
// acquire it again before continuing.
type LockExpiredError struct {
	Owner    string
	Resource ResourceRef
	// ExpiredAt is when the caller's lock expired; zero when there was no
	// lock of the caller's at all.
	ExpiredAt time.Time
	// WrittenAt, when set, is when the store finished writing the lock the
	// caller asked for: after ExpiredAt, because the write waited longer
	// than the lock's TTL.
	WrittenAt time.Time
}

func (e *LockExpiredError) Error() string {
	if !e.WrittenAt.IsZero() {
		return fmt.Sprintf("the lock of owner %q on %s expired at %s, before the store finished writing it at %s; "+
			"the store was too slow for the TTL: acquire again, with a longer TTL or once the database is less busy",
			e.Owner, e.Resource, e.ExpiredAt.UTC().Format(time.RFC3339Nano), e.WrittenAt.UTC().Format(time.RFC3339Nano))
	}
	if e.ExpiredAt.IsZero() {
		return fmt.Sprintf("owner %q holds no lock on %s; acquire it again before continuing", e.Owner, e.Resource)
	}
	return fmt.Sprintf("the lock of owner %q on %s expired at %s; acquire it again before continuing",
		e.Owner, e.Resource, e.ExpiredAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrExpired) true.
func (e *LockExpiredError) Is(target error) bool { return target == ErrExpired }

// LostReason says why a held lock was lost.
type LostReason int

// Why a lock is lost.
const (
	// LostExpired: the lock passed its expiry without being renewed, and
	// nobody has taken it yet.
	LostExpired LostReason = iota + 1
	// LostTakenOver: another owner holds the resource now (NewHolder).
	LostTakenOver
	// LostStoreFailing: every renewal failed until the lock's expiry (Err
	// is the last failure), or one failed permanently (IsPermanent), which
	// ends the hold at once. The loss matches ErrUnavailable too.
	LostStoreFailing
	// LostClosed: the lock service was closed while the lock was kept
	// alive; the container releases the owner's locks.
	LostClosed
	// LostRemoved: the lock was removed from the store before its expiry:
	// released behind the keep-alive's back (by the same owner elsewhere,
	// or an operator), or purged by a cleanup whose clock ran ahead.
	LostRemoved
)

func (r LostReason) String() string {
	switch r {
	case LostExpired:
		return "expired"
	case LostTakenOver:
		return "taken over"
	case LostStoreFailing:
		return "store failing"
	case LostClosed:
		return "service closed"
	case LostRemoved:
		return "removed"
	}
	return "unknown"
}

// LockLostError reports that a lock being kept alive was lost: whatever it
// protected must stop, because another owner may hold the resource now or
// at any moment. It matches ErrExpired.
type LockLostError struct {
	// Lock is the lock as last held.
	Lock   Lock
	Reason LostReason
	// At is when the loss was noticed.
	At time.Time
	// NewHolder is the owner's successor, for LostTakenOver.
	NewHolder *Lock
	// Err is the last store failure, for LostStoreFailing.
	Err error
}

func (e *LockLostError) Error() string {
	const next = "stop the work it protected, and acquire it again before continuing"
	l := e.Lock
	switch e.Reason {
	case LostTakenOver:
		return fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: owner %q took it over (token %d)%s; %s",
			l.Owner, l.Resource, l.Token, e.NewHolder.Owner, e.NewHolder.Token, e.takenWhen(), next)
	case LostStoreFailing:
		if IsPermanent(e.Err) {
			return fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: the lock store refused its renewal with a failure that no retry can succeed against, "+
				"so the hold ended then, before its expiry at %s (the failure: %v); stop the work it protected, act on the failure as it says, then acquire it again",
				l.Owner, l.Resource, l.Token, l.ExpiresAt.UTC().Format(time.RFC3339Nano), e.Err)
		}
		return fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: the lock store could not be reached, or did not answer in time, "+
			"so no renewal completed before the lock expired at %s (last failure: %v); stop the work it protected, "+
			"check that the database is reachable and not kept busy (a long write transaction, a stalled disk or network), then acquire it again",
			l.Owner, l.Resource, l.Token, l.ExpiresAt.UTC().Format(time.RFC3339Nano), e.Err)
	case LostClosed:
		return fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: the lock service was closed; %s",
			l.Owner, l.Resource, l.Token, next)
	case LostRemoved:
		return fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: it was removed from the store before its expiry (released elsewhere, or purged); %s",
			l.Owner, l.Resource, l.Token, next)
	}
	if l.ExpiresAt.IsZero() {
		return fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: it is no longer stored (it expired and was cleaned up, or it was released); %s",
			l.Owner, l.Resource, l.Token, next)
	}
	return fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: it expired at %s without being renewed; %s",
		l.Owner, l.Resource, l.Token, l.ExpiresAt.UTC().Format(time.RFC3339Nano), next)
}

// takenWhen says when the new holder took the resource relative to the
// lost lock's expiry. The new lock's time is on its holder's clock: one
// later than the loss was noticed (At, on this clock) proves the clocks
// disagree, so no order is claimed then.
func (e *LockLostError) takenWhen() string {
	took, expires := e.NewHolder.AcquiredAt, e.Lock.ExpiresAt
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	switch {
	case expires.IsZero():
		return ""
	case took.IsZero():
		return " (the lock was due to expire at " + at(expires) + ")"
	case !e.At.IsZero() && took.After(e.At):
		return fmt.Sprintf(" at %s by the clock that took it, later than this process's clock when it noticed (%s): the clocks disagree "+
			"(one runs ahead, or this one was stepped back), so whether that was before or after the lock's expiry at %s is not known",
			at(took), at(e.At), at(expires))
	case took.Before(expires):
		return fmt.Sprintf(" at %s, before its expiry at %s: the lock had been removed (released elsewhere, or purged) or its holder's process was found gone",
			at(took), at(expires))
	}
	return fmt.Sprintf(" at %s, after it expired at %s", at(took), at(expires))
}

// Is makes errors.Is(err, ErrExpired) true; also ErrClosed for
// LostClosed, and ErrUnavailable for LostStoreFailing whatever the last
// failure (a renewal that never answered carries no *StoreError).
func (e *LockLostError) Is(target error) bool {
	return target == ErrExpired || (target == ErrClosed && e.Reason == LostClosed) ||
		(target == ErrUnavailable && e.Reason == LostStoreFailing)
}

// Unwrap returns the last store failure, if any.
func (e *LockLostError) Unwrap() error { return e.Err }

// ValidationError reports an invalid parameter. Field is the name of the
// parameter as stored (owner_id, resource_type, resource_id, ttl).
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrValidation) true.
func (e *ValidationError) Is(target error) bool { return target == ErrValidation }

// StoreErrorKind classifies why the lock store failed.
type StoreErrorKind int

// The kinds of store failure.
const (
	// StoreInternal is any failure not classified below.
	StoreInternal StoreErrorKind = iota
	// StoreBusy: the database stayed locked by another writer for longer
	// than the busy timeout and the retries allowed.
	StoreBusy
	// StoreReadOnly: the database file, its directory or the connection
	// does not allow writing.
	StoreReadOnly
	// StoreCorrupt: the file is not a database, or is damaged.
	StoreCorrupt
	// StoreUnreachable: the database could not be opened or reached.
	StoreUnreachable
	// StoreFull: the disk or the database is full.
	StoreFull
	// StoreSchema: the database does not have the expected schema.
	StoreSchema
	// StoreTokensExhausted: the database has issued the largest fencing
	// token it can store, and can grant no more locks. Tokens only grow,
	// so no retry helps: the service needs a new lock database.
	StoreTokensExhausted
)

var storeKindText = map[StoreErrorKind]struct{ what, advice string }{
	StoreInternal:    {"failed", "see the cause below"},
	StoreBusy:        {"is busy: another writer kept it locked", "retry later, and look for a process holding a long write transaction"},
	StoreReadOnly:    {"is read-only", "make the database file and its directory writable by this process"},
	StoreCorrupt:     {"is not a valid database", "point the service at the right file, or move the damaged file away"},
	StoreUnreachable: {"cannot be reached", "check the path or DSN and that the directory exists"},
	StoreFull:        {"is full", "free disk space"},
	StoreSchema:      {"does not have the expected schema", "let the service open it once so that its migrations run"},
	StoreTokensExhausted: {"has issued its last fencing token, and can grant no more locks",
		"move the service to a new lock database, whose tokens start again at 1: first have the resources that check tokens forget the last token they accepted, or they will refuse the new, smaller ones"},
}

// String returns a short name for the kind.
func (k StoreErrorKind) String() string {
	switch k {
	case StoreBusy:
		return "busy"
	case StoreReadOnly:
		return "read-only"
	case StoreCorrupt:
		return "corrupt"
	case StoreUnreachable:
		return "unreachable"
	case StoreFull:
		return "full"
	case StoreSchema:
		return "schema"
	case StoreTokensExhausted:
		return "tokens-exhausted"
	default:
		return "internal"
	}
}

// StoreError reports a failure of the lock store. It always matches
// ErrUnavailable; Kind says why and Err carries the underlying cause.
type StoreError struct {
	Op   string
	Kind StoreErrorKind
	Err  error
	// Advice, when set, replaces the kind's default advice (which is
	// written for a database file) with the adapter's own.
	Advice string
	// Permanent, set by the adapter, says that no retry through the store
	// as opened can succeed whatever Kind says (its database file was
	// removed, renamed or replaced). See IsPermanent.
	Permanent bool
}

func (e *StoreError) Error() string {
	t := storeKindText[e.Kind]
	advice := t.advice
	if e.Advice != "" {
		advice = e.Advice
	}
	msg := fmt.Sprintf("%s: lock store %s; %s", e.Op, t.what, advice)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *StoreError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the underlying cause.
func (e *StoreError) Unwrap() error { return e.Err }

// IsPermanent reports whether err is a store failure that no retry can
// resolve while the store stays open: one marked Permanent, or of kind
// StoreReadOnly, StoreSchema, StoreCorrupt or StoreTokensExhausted. A
// keep-alive retries any other failure until the lock's expiry.
func IsPermanent(err error) bool {
	var se *StoreError
	if !errors.As(err, &se) {
		return false
	}
	switch se.Kind {
	case StoreReadOnly, StoreSchema, StoreCorrupt, StoreTokensExhausted:
		return true
	}
	return se.Permanent
}

// IsStoreKind reports whether err is a *StoreError of the given kind.
func IsStoreKind(err error, kind StoreErrorKind) bool {
	var se *StoreError
	return errors.As(err, &se) && se.Kind == kind
}
