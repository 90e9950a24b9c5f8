package domain

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors: every error the lock service returns matches one of
// them with errors.Is; the typed errors below carry the details.
var (
	ErrConflict    = errors.New("lock is held by another owner")
	ErrExpired     = errors.New("lock has expired") // or no longer exists
	ErrValidation  = errors.New("invalid lock parameter")
	ErrNotFound    = errors.New("no lock on resource")
	ErrUnavailable = errors.New("lock store unavailable") // the StoreError's Kind says why
	ErrClosed      = errors.New("lock service is closed; open a new container to take locks again")
	ErrOwnerInUse  = errors.New("owner id is in use by another open container of the lock database")
)

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// LockConflictError reports that Holder holds an active lock on the resource the caller asked for.
type LockConflictError struct {
	Holder    Lock
	Now       time.Time     // when the conflict was decided
	Waited    time.Duration // how long the caller waited; zero without a wait
	Cause     error         // why a wait ended (the context's error); nil without a wait
	InProcess bool          // Holder is a handle of the caller's own service, excluding its other handles
	Nested    bool          // the caller runs in the holding handle's KeepAlive or Do
	SameOwner bool          // Holder is another acquisition of the caller's owner id
	RowHeld   bool          // Holder has expired, but its fenced write still holds its row
}

func (e *LockConflictError) Error() string {
	h := e.Holder
	waited := ""
	if e.Waited > 0 {
		waited = fmt.Sprintf(" after waiting %s", roundForHumans(e.Waited))
	}
	held := fmt.Sprintf("acquired %s, expires %s, in %s", rfc3339(h.AcquiredAt), rfc3339(h.ExpiresAt), roundForHumans(h.Remaining(e.Now)))
	if h.Note != "" {
		// Quoted: a note is the holder's words, not the service's.
		held = fmt.Sprintf("note %q, %s", h.Note, held)
	}
	switch {
	case e.Nested:
		return fmt.Sprintf("%s is already held by the handle whose work this call runs in (owner %q, token %d): taking it again would wait for itself; "+
			"use that handle, or pass AcquireOptions.Reentrant to re-enter it", h.Resource, h.Owner, h.Token)
	case e.RowHeld:
		return fmt.Sprintf("%s is still held by owner %q (token %d): its lock expired at %s, but a transaction that holds the lock's row "+
			"(the holder's fenced write, which checked its fence before the expiry) has not ended%s; the lock changes hands once it commits or "+
			"rolls back: wait for it (AcquireOptions.Wait), or ask the holder to end that transaction",
			h.Resource, h.Owner, h.Token, rfc3339(h.ExpiresAt), waited)
	case e.SameOwner && !e.InProcess:
		return fmt.Sprintf("%s is held by another acquisition of owner %q (token %d, %s)%s: "+
			"an owner-scoped Acquire of that owner, another process given the same owner id, or a handle whose release did not complete; "+
			"a handle never shares it: wait for it (AcquireOptions.Wait), release it with the handle or owner that took it, "+
			"or give each process its own owner id", h.Resource, h.Owner, h.Token, held, waited)
	case e.InProcess:
		return fmt.Sprintf("%s is held by another handle of this process (owner %q, token %d, %s)%s; "+
			"wait for it (AcquireOptions.Wait) or release that handle first", h.Resource, h.Owner, h.Token, held, waited)
	}
	return fmt.Sprintf("%s is locked by owner %q (%s)%s; wait for it to be released or to expire, or ask the holder to release it",
		h.Resource, h.Owner, held, waited)
}

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

// LockExpiredError reports that the caller's lock has expired or is gone:
// it must acquire the resource again before continuing.
type LockExpiredError struct {
	Owner     string
	Resource  ResourceRef
	ExpiredAt time.Time // zero when the caller had no lock
	WrittenAt time.Time // when set, the store wrote the lock only after ExpiredAt
}

func (e *LockExpiredError) Error() string {
	if !e.WrittenAt.IsZero() {
		return fmt.Sprintf("the lock of owner %q on %s expired at %s, before the store finished writing it at %s; "+
			"the store was too slow for the TTL: acquire again, with a longer TTL or once the database is less busy",
			e.Owner, e.Resource, rfc3339(e.ExpiredAt), rfc3339(e.WrittenAt))
	}
	if e.ExpiredAt.IsZero() {
		return fmt.Sprintf("owner %q holds no lock on %s; acquire it again before continuing", e.Owner, e.Resource)
	}
	return fmt.Sprintf("the lock of owner %q on %s expired at %s; acquire it again before continuing", e.Owner, e.Resource, rfc3339(e.ExpiredAt))
}

// Is makes errors.Is(err, ErrExpired) true.
func (e *LockExpiredError) Is(target error) bool { return target == ErrExpired }

// LostReason says why a held lock was lost.
type LostReason int

// Why a lock is lost.
const (
	LostExpired      LostReason = iota + 1 // expired unrenewed, not yet taken
	LostTakenOver                          // another owner holds it (NewHolder)
	LostStoreFailing                       // renewals failed until the expiry, or one permanently
	LostClosed                             // the service was closed
	LostRemoved                            // released elsewhere or purged before its expiry
)

var lostReasons = map[LostReason]string{LostExpired: "expired", LostTakenOver: "taken over",
	LostStoreFailing: "store failing", LostClosed: "service closed", LostRemoved: "removed"}

func (r LostReason) String() string {
	if s, ok := lostReasons[r]; ok {
		return s
	}
	return "unknown"
}

// LockLostError reports that a lock being kept alive was lost: the work it
// protected must stop, as another owner may hold the resource. It matches ErrExpired.
type LockLostError struct {
	Lock      Lock // as last held
	Reason    LostReason
	At        time.Time // when the loss was noticed
	NewHolder *Lock     // for LostTakenOver
	Err       error     // the last store failure, for LostStoreFailing
}

func (e *LockLostError) Error() string {
	const next = "stop the work it protected, and acquire it again before continuing"
	l := e.Lock
	lost := fmt.Sprintf("the lock of owner %q on %s (token %d) was lost: ", l.Owner, l.Resource, l.Token)
	switch {
	case e.Reason == LostTakenOver:
		return lost + fmt.Sprintf("owner %q took it over (token %d)%s; %s", e.NewHolder.Owner, e.NewHolder.Token, e.takenWhen(), next)
	case e.Reason == LostStoreFailing && IsPermanent(e.Err):
		return lost + fmt.Sprintf("the lock store refused its renewal with a failure that no retry can succeed against, "+
			"so the hold ended then, before its expiry at %s (the failure: %v); stop the work it protected, act on the failure as it says, then acquire it again",
			rfc3339(l.ExpiresAt), e.Err)
	case e.Reason == LostStoreFailing:
		return lost + fmt.Sprintf("the lock store could not be reached, or did not answer in time, "+
			"so no renewal completed before the lock expired at %s (last failure: %v); stop the work it protected, "+
			"check that the database is reachable and not kept busy (a long write transaction, a stalled disk or network), then acquire it again",
			rfc3339(l.ExpiresAt), e.Err)
	case e.Reason == LostClosed:
		return lost + "the lock service was closed; " + next
	case e.Reason == LostRemoved:
		return lost + "it was removed from the store before its expiry (released elsewhere, or purged); " + next
	case l.ExpiresAt.IsZero():
		return lost + "it is no longer stored (it expired and was cleaned up, or it was released); " + next
	}
	return lost + fmt.Sprintf("it expired at %s without being renewed; %s", rfc3339(l.ExpiresAt), next)
}

// takenWhen places the takeover against the lost lock's expiry, unless the
// new holder's clock is provably ahead of this one.
func (e *LockLostError) takenWhen() string {
	took, expires := e.NewHolder.AcquiredAt, e.Lock.ExpiresAt
	switch {
	case expires.IsZero():
		return ""
	case took.IsZero():
		return " (the lock was due to expire at " + rfc3339(expires) + ")"
	case !e.At.IsZero() && took.After(e.At):
		return fmt.Sprintf(" at %s by the clock that took it, later than this process's clock when it noticed (%s): the clocks disagree "+
			"(one runs ahead, or this one was stepped back), so whether that was before or after the lock's expiry at %s is not known",
			rfc3339(took), rfc3339(e.At), rfc3339(expires))
	case took.Before(expires):
		return fmt.Sprintf(" at %s, before its expiry at %s: the lock had been removed (released elsewhere, or purged) or its holder's process was found gone",
			rfc3339(took), rfc3339(expires))
	}
	return fmt.Sprintf(" at %s, after it expired at %s", rfc3339(took), rfc3339(expires))
}

// Is makes errors.Is(err, ErrExpired) true; also ErrClosed for
// LostClosed, and ErrUnavailable for LostStoreFailing even when Err is no
// *StoreError (a renewal that never answered).
func (e *LockLostError) Is(target error) bool {
	return target == ErrExpired || (target == ErrClosed && e.Reason == LostClosed) ||
		(target == ErrUnavailable && e.Reason == LostStoreFailing)
}

// Unwrap returns the last store failure, if any.
func (e *LockLostError) Unwrap() error { return e.Err }

// ValidationError reports an invalid parameter, by its stored name
// (owner_id, resource_type, resource_id, ttl).
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrValidation) true.
func (e *ValidationError) Is(target error) bool { return target == ErrValidation }

// StoreErrorKind classifies why the lock store failed.
type StoreErrorKind int

// The kinds of store failure, as storeKinds describes them.
const (
	StoreInternal StoreErrorKind = iota
	StoreBusy
	StoreReadOnly
	StoreCorrupt
	StoreUnreachable
	StoreFull
	StoreSchema
	StoreTokensExhausted
)

var storeKinds = map[StoreErrorKind]struct{ name, what, advice string }{
	StoreInternal:    {"internal", "failed", "see the cause below"},
	StoreBusy:        {"busy", "is busy: another writer kept it locked", "retry later, and look for a process holding a long write transaction"},
	StoreReadOnly:    {"read-only", "is read-only", "make the database file and its directory writable by this process"},
	StoreCorrupt:     {"corrupt", "is not a valid database", "point the service at the right file, or move the damaged file away"},
	StoreUnreachable: {"unreachable", "cannot be reached", "check the path or DSN and that the directory exists"},
	StoreFull:        {"full", "is full", "free disk space"},
	StoreSchema:      {"schema", "does not have the expected schema", "let the service open it once so that its migrations run"},
	StoreTokensExhausted: {"tokens-exhausted", "has issued its last fencing token, and can grant no more locks",
		"move the service to a new lock database, whose tokens start again at 1: first have the resources that check tokens forget the last token they accepted, or they will refuse the new, smaller ones"},
}

// String returns a short name for the kind.
func (k StoreErrorKind) String() string {
	if t, ok := storeKinds[k]; ok {
		return t.name
	}
	return "internal"
}

// StoreError reports a failure of the lock store. It always matches
// ErrUnavailable; Kind says why and Err carries the underlying cause.
type StoreError struct {
	Op        string
	Kind      StoreErrorKind
	Err       error
	Advice    string // when set, replaces the kind's advice, written for a file
	Permanent bool   // no retry can succeed whatever Kind says (see IsPermanent)
}

func (e *StoreError) Error() string {
	t := storeKinds[e.Kind]
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
// resolve while the store stays open: marked Permanent, or of kind
// StoreReadOnly, StoreSchema, StoreCorrupt or StoreTokensExhausted.
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

// StaleSnapshotError reports a fence checked in a transaction whose snapshot
// predates the lock's last change (SQLite deferred, PostgreSQL above READ
// COMMITTED). It unwraps to a StoreBusy *StoreError, never to ErrExpired.
type StaleSnapshotError struct {
	Op        string
	What      string // what is true, in the database's terms
	Isolation string // the transaction's isolation level ("REPEATABLE READ"), if known
	Held      bool   // the lock, read outside the transaction, is still held
	Advice    string
	Err       error // the database's own report, if any
}

func (e *StaleSnapshotError) Error() string {
	msg := e.Op + ": " + e.What + "; " + e.Advice
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

// Unwrap returns the busy StoreError that e refines.
func (e *StaleSnapshotError) Unwrap() error {
	return &StoreError{Op: e.Op, Kind: StoreBusy, Err: e.Err, Advice: e.Advice}
}

// OwnerInUseError is Open's refusal of an owner id that another open
// container of the same lock database uses: another live process, or
// another container of this process. Sharing it would merge the two
// processes' owner-scoped locks (each re-enters and releases the other's),
// and one's Close would release the other's locks.
type OwnerInUseError struct {
	Owner    string // the owner id refused
	Database string // the database, as the store names it (a PostgreSQL DSN without its password)
	Where    string // where the claim is kept, in the store's terms: for an operator looking for its holder
}

func (e *OwnerInUseError) Error() string {
	return fmt.Sprintf("owner id %q is in use: another process (or another container of this process) has the lock database %s open with it (%s); "+
		"give each process its own owner id (Config.Owner; empty means one unique to the process), or wait for the other process to exit or close its container, "+
		"which frees the id at once (a process that dies frees it too)", e.Owner, e.Database, e.Where)
}

// Is makes errors.Is(err, ErrOwnerInUse) true.
func (e *OwnerInUseError) Is(target error) bool { return target == ErrOwnerInUse }
