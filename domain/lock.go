// Package domain holds the vocabulary of the lock service: locks,
// resources, the TTL policy, validation and errors. Every rule that
// involves time takes "now", so it answers alike under any clock.
package domain

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ResourceType names the kind of thing a lock protects.
type ResourceType string

// The resource types that can be locked.
const (
	ResourcePlan    ResourceType = "plan"
	ResourceProject ResourceType = "project"
)

// ResourceTypes lists every valid ResourceType, in a stable order.
func ResourceTypes() []ResourceType { return []ResourceType{ResourcePlan, ResourceProject} }

// Valid reports whether t is one of the known resource types.
func (t ResourceType) Valid() bool { return t == ResourcePlan || t == ResourceProject }

// ResourceRef identifies one lockable resource, which has one lock at most.
type ResourceRef struct {
	Type ResourceType
	ID   string
}

// NewResourceRef returns a validated reference, or a *ValidationError.
func NewResourceRef(typ ResourceType, id string) (ResourceRef, error) {
	ref := ResourceRef{Type: typ, ID: id}
	return ref, ref.Validate()
}

// Validate checks the type and the id of the reference.
func (r ResourceRef) Validate() error {
	if !r.Type.Valid() {
		return &ValidationError{Field: "resource_type",
			Reason: fmt.Sprintf("%q is not a resource type; use %q or %q", string(r.Type), ResourcePlan, ResourceProject)}
	}
	return validateIdentifier("resource_id", r.ID)
}

// String renders the reference as "type/id", the id quoted when it is
// empty, has spaces or does not print, so that it cannot disguise itself.
func (r ResourceRef) String() string {
	id := r.ID
	if id == "" || strings.IndexFunc(id, func(c rune) bool { return !unicode.IsGraphic(c) || unicode.IsSpace(c) }) >= 0 || !utf8.ValidString(id) {
		id = strconv.Quote(id)
	}
	return string(r.Type) + "/" + id
}

// MaxIdentifierBytes is the longest owner or resource id accepted: the stores' VARCHAR(255) columns.
const MaxIdentifierBytes = 255

// ValidateOwner checks an owner id.
func ValidateOwner(owner string) error { return validateIdentifier("owner_id", owner) }

func validateIdentifier(field, v string) error {
	fail := func(reason string) error { return &ValidationError{Field: field, Reason: reason} }
	switch {
	case v == "":
		return fail("must not be empty")
	case strings.TrimSpace(v) == "":
		return fail("must not be blank (only white space)")
	case len(v) > MaxIdentifierBytes:
		return fail(fmt.Sprintf("is %d bytes long; the limit is %d bytes", len(v), MaxIdentifierBytes))
	case !utf8.ValidString(v):
		return fail("is not valid UTF-8")
	case strings.IndexByte(v, 0) >= 0:
		return fail("must not contain NUL bytes")
	}
	return nil
}

// MaxNoteBytes is the longest note accepted: enough for a sentence or a
// URL, short enough for a table row and an error message.
const MaxNoteBytes = 256

// ValidateNote checks a lock's note: empty (no note), or at most
// MaxNoteBytes of valid UTF-8 without control characters, so that it
// prints on one line of a terminal and fits the stores' column.
func ValidateNote(note string) error {
	fail := func(reason string) error { return &ValidationError{Field: "note", Reason: reason} }
	switch {
	case len(note) > MaxNoteBytes:
		return fail(fmt.Sprintf("is %d bytes long; the limit is %d bytes: shorten it, or point to the details (a URL, a ticket)", len(note), MaxNoteBytes))
	case !utf8.ValidString(note):
		return fail("is not valid UTF-8")
	case strings.IndexFunc(note, unicode.IsControl) >= 0:
		return fail("must not contain control characters (a newline, a tab, a terminal escape): write it on one line")
	}
	return nil
}

// Lock is one held (or expired but not yet purged) advisory lock, active
// from AcquiredAt up to, but not including, ExpiresAt.
type Lock struct {
	Token      int64 // the fencing token: it grows at every change of hands, so a former holder is refused
	Owner      string
	Resource   ResourceRef
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Note       string // what the holder said it does, given at acquire; empty: none
}

// ExpiredAt reports whether the lock has expired at the instant now.
func (l Lock) ExpiredAt(now time.Time) bool { return !now.Before(l.ExpiresAt) }

// Remaining returns how long the lock stays active after now.
func (l Lock) Remaining(now time.Time) time.Duration {
	if l.ExpiredAt(now) {
		return 0
	}
	return l.ExpiresAt.Sub(now)
}

// HeldBy reports whether owner holds the lock at the instant now.
func (l Lock) HeldBy(owner string, now time.Time) bool { return l.Owner == owner && !l.ExpiredAt(now) }

// The TTL policy: a lock lives for its TTL unless renewed or released.
const (
	DefaultLockTTL = 300 * time.Second  // replaces a zero TTL
	MinLockTTL     = 5 * time.Second    // the shortest TTL accepted
	MaxLockTTL     = 3600 * time.Second // the longest; longer work renews
)

// ResolveTTL returns DefaultLockTTL for zero, else ttl or ValidateTTL's
// error: a mistake is never clamped.
func ResolveTTL(ttl time.Duration) (time.Duration, error) {
	if ttl == 0 {
		return DefaultLockTTL, nil
	}
	if err := ValidateTTL(ttl); err != nil {
		return 0, err
	}
	return ttl, nil
}

// ValidateTTL checks that ttl lies within [MinLockTTL, MaxLockTTL].
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinLockTTL || ttl > MaxLockTTL {
		return &ValidationError{Field: "ttl",
			Reason: fmt.Sprintf("%v is outside the allowed range %v to %v; pass a TTL within it, or zero for the default %v", ttl, MinLockTTL, MaxLockTTL, DefaultLockTTL)}
	}
	return nil
}

// RenewInterval is how often to renew a lock of ttl: half of it, the other
// half left to absorb a slow renewal.
func RenewInterval(ttl time.Duration) time.Duration { return ttl / 2 }
