package domain

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxIdentifierBytes is the longest owner or resource id accepted, in bytes;
// it matches the VARCHAR(255) columns that store them.
const MaxIdentifierBytes = 255

// ValidateOwner checks an owner id.
func ValidateOwner(owner string) error { return validateIdentifier("owner_id", owner) }

// validateIdentifier enforces the rules shared by owner and resource ids:
// non-empty, not only white space, valid UTF-8 without NUL bytes, and at
// most MaxIdentifierBytes long.
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
