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

// ResourceRef identifies one lockable resource. At most one lock exists per
// ResourceRef at any time.
type ResourceRef struct {
	Type ResourceType
	ID   string
}

// NewResourceRef returns a validated reference, or a *ValidationError naming
// the offending field.
func NewResourceRef(typ ResourceType, id string) (ResourceRef, error) {
	ref := ResourceRef{Type: typ, ID: id}
	return ref, ref.Validate()
}

// Validate checks the type and the id of the reference.
func (r ResourceRef) Validate() error {
	if !r.Type.Valid() {
		return &ValidationError{
			Field:  "resource_type",
			Reason: fmt.Sprintf("%q is not a resource type; use %q or %q", string(r.Type), ResourcePlan, ResourceProject),
		}
	}
	return validateIdentifier("resource_id", r.ID)
}

// String renders the reference as "type/id", for messages and logs. An id
// with spaces or characters that do not print is quoted, so that it cannot
// disguise itself or disturb a terminal.
func (r ResourceRef) String() string {
	id := r.ID
	if id == "" || strings.IndexFunc(id, func(c rune) bool { return !unicode.IsGraphic(c) || unicode.IsSpace(c) }) >= 0 || !utf8.ValidString(id) {
		id = strconv.Quote(id)
	}
	return string(r.Type) + "/" + id
}

// Lock is one held (or expired but not yet purged) advisory lock.
//
// A lock is active from AcquiredAt up to, but not including, ExpiresAt.
type Lock struct {
	// Token is the fencing token. It strictly increases every time the
	// resource changes hands and stays the same while one owner re-enters
	// or renews. Pass it to whatever the lock protects so that a former
	// holder that was paused past its expiry can be refused.
	Token      int64
	Owner      string
	Resource   ResourceRef
	AcquiredAt time.Time
	ExpiresAt  time.Time
}

// ExpiredAt reports whether the lock has expired at the instant now.
func (l Lock) ExpiredAt(now time.Time) bool { return !now.Before(l.ExpiresAt) }

// Remaining returns how long the lock stays active after now (zero once
// expired).
func (l Lock) Remaining(now time.Time) time.Duration {
	if l.ExpiredAt(now) {
		return 0
	}
	return l.ExpiresAt.Sub(now)
}

// HeldBy reports whether owner holds the lock at the instant now.
func (l Lock) HeldBy(owner string, now time.Time) bool {
	return l.Owner == owner && !l.ExpiredAt(now)
}
