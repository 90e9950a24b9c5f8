package domain_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

func TestResolveTTL(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want time.Duration
		ok   bool
	}{
		{0, domain.DefaultLockTTL, true},
		{domain.MinLockTTL, domain.MinLockTTL, true},
		{domain.MaxLockTTL, domain.MaxLockTTL, true},
		{90 * time.Second, 90 * time.Second, true},
		{domain.MinLockTTL - time.Nanosecond, 0, false},
		{domain.MaxLockTTL + time.Nanosecond, 0, false},
		{-time.Second, 0, false},
		{time.Duration(1<<63 - 1), 0, false},
	} {
		t.Run(tc.in.String(), func(t *testing.T) {
			got, err := domain.ResolveTTL(tc.in)
			if !tc.ok {
				var ve *domain.ValidationError
				require.ErrorAs(t, err, &ve)
				assert.Equal(t, "ttl", ve.Field)
				assert.Contains(t, err.Error(), "5s to 1h0m0s", "says what is allowed")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestResourceRef_Validate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ref   domain.ResourceRef
		field string
	}{
		{"Plan", domain.ResourceRef{Type: domain.ResourcePlan, ID: "p"}, ""},
		{"Project", domain.ResourceRef{Type: domain.ResourceProject, ID: "日本語 ok"}, ""},
		{"MaxBytes", domain.ResourceRef{Type: domain.ResourcePlan, ID: strings.Repeat("a", 255)}, ""},
		{"TooLong", domain.ResourceRef{Type: domain.ResourcePlan, ID: strings.Repeat("a", 256)}, "resource_id"},
		{"MultibyteTooLong", domain.ResourceRef{Type: domain.ResourcePlan, ID: strings.Repeat("é", 128)}, "resource_id"},
		{"Empty", domain.ResourceRef{Type: domain.ResourcePlan}, "resource_id"},
		{"Blank", domain.ResourceRef{Type: domain.ResourcePlan, ID: "\u00a0 \t"}, "resource_id"},
		{"NUL", domain.ResourceRef{Type: domain.ResourcePlan, ID: "a\x00"}, "resource_id"},
		{"BadUTF8", domain.ResourceRef{Type: domain.ResourcePlan, ID: "\xc3("}, "resource_id"},
		{"BadType", domain.ResourceRef{Type: "plans", ID: "p"}, "resource_type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ref.Validate()
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tc.field, ve.Field)
			require.ErrorIs(t, err, domain.ErrValidation)
		})
	}
}

func TestLock_ExpiredAt(t *testing.T) {
	exp := time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)
	l := domain.Lock{Owner: "A", ExpiresAt: exp}
	assert.False(t, l.ExpiredAt(exp.Add(-time.Nanosecond)))
	assert.True(t, l.ExpiredAt(exp), "expired at the instant ExpiresAt")
	assert.True(t, l.ExpiredAt(exp.Add(time.Nanosecond)))
	assert.Equal(t, time.Second, l.Remaining(exp.Add(-time.Second)))
	assert.Zero(t, l.Remaining(exp))
	assert.True(t, l.HeldBy("A", exp.Add(-time.Second)))
	assert.False(t, l.HeldBy("A", exp))
	assert.False(t, l.HeldBy("B", exp.Add(-time.Second)))
}

func TestErrors(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	holder := domain.Lock{Token: 7, Owner: "A", Resource: domain.ResourceRef{Type: domain.ResourcePlan, ID: "p"}, AcquiredAt: at, ExpiresAt: at.Add(time.Minute)}
	for _, tc := range []struct {
		err      error
		sentinel error
		says     []string
	}{
		{&domain.LockConflictError{Holder: holder, Now: at.Add(20 * time.Second)}, domain.ErrConflict,
			[]string{`plan/p`, `"A"`, "in 40s", "wait"}},
		{&domain.LockExpiredError{Owner: "A", Resource: holder.Resource, ExpiredAt: at}, domain.ErrExpired,
			[]string{"expired at 2026-01-01T00:00:00Z", "acquire it again"}},
		{&domain.LockExpiredError{Owner: "A", Resource: holder.Resource}, domain.ErrExpired,
			[]string{"holds no lock", "acquire it again"}},
		{&domain.ValidationError{Field: "ttl", Reason: "too long"}, domain.ErrValidation, []string{"invalid ttl: too long"}},
		{&domain.StoreError{Op: "acquire", Kind: domain.StoreReadOnly, Err: io.ErrUnexpectedEOF}, domain.ErrUnavailable,
			[]string{"acquire", "read-only", "writable", io.ErrUnexpectedEOF.Error()}},
	} {
		t.Run(fmt.Sprintf("%T", tc.err), func(t *testing.T) {
			wrapped := fmt.Errorf("outer: %w", tc.err)
			require.ErrorIs(t, wrapped, tc.sentinel)
			for _, other := range []error{domain.ErrConflict, domain.ErrExpired, domain.ErrValidation, domain.ErrUnavailable} {
				if other != tc.sentinel {
					assert.False(t, errors.Is(wrapped, other), "matches only its own sentinel")
				}
			}
			for _, s := range tc.says {
				assert.Contains(t, tc.err.Error(), s)
			}
		})
	}
	se := &domain.StoreError{Op: "x", Kind: domain.StoreBusy, Err: io.EOF}
	require.ErrorIs(t, se, io.EOF, "the cause is unwrapped")
	assert.True(t, domain.IsStoreKind(fmt.Errorf("w: %w", se), domain.StoreBusy))
	assert.False(t, domain.IsStoreKind(se, domain.StoreFull))
}

func TestRenewInterval(t *testing.T) {
	assert.Equal(t, 150*time.Second, domain.RenewInterval(domain.DefaultLockTTL))
}

func TestResourceRef_String(t *testing.T) {
	for id, want := range map[string]string{
		"p1":          "plan/p1",
		"日本":          "plan/日本",
		"two words":   `plan/"two words"`,
		"bell\a":      `plan/"bell\a"`,
		"\x1b[31mred": `plan/"\x1b[31mred"`,
		"bad\xff":     `plan/"bad\xff"`,
		"":            `plan/""`,
	} {
		assert.Equal(t, want, domain.ResourceRef{Type: domain.ResourcePlan, ID: id}.String())
	}
}

// A store that checks a fence may know the lost lock's token but not its
// expiry (the row is gone): the message then gives no zero time.
func TestLockLostError_UnknownExpiry(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p"}
	gone := domain.Lock{Token: 3, Owner: "A", Resource: ref}
	next := domain.Lock{Token: 4, Owner: "B", Resource: ref, AcquiredAt: at, ExpiresAt: at.Add(time.Minute)}
	for _, tc := range []struct {
		err  *domain.LockLostError
		says string
	}{
		{&domain.LockLostError{Lock: gone, Reason: domain.LostTakenOver, NewHolder: &next}, `owner "B" took it over (token 4); stop`},
		{&domain.LockLostError{Lock: gone, Reason: domain.LostExpired}, "no longer stored"},
	} {
		t.Run(tc.err.Reason.String(), func(t *testing.T) {
			assert.Contains(t, tc.err.Error(), tc.says)
			assert.NotContains(t, tc.err.Error(), "0001-01-01")
		})
	}
	known := gone
	known.ExpiresAt = at
	assert.Contains(t, (&domain.LockLostError{Lock: known, Reason: domain.LostTakenOver, NewHolder: &next}).Error(),
		"after it expired at 2026-01-01T00:00:00Z")
}

// A loss matches ErrExpired whatever its reason, ErrClosed only when the
// service closed, and ErrUnavailable when the store failed every renewal,
// whatever the last failure was (a renewal that never answered is no
// *domain.StoreError).
func TestLockLostError_Is(t *testing.T) {
	for _, r := range []domain.LostReason{domain.LostExpired, domain.LostTakenOver, domain.LostStoreFailing, domain.LostClosed, domain.LostRemoved} {
		err := fmt.Errorf("wrapped: %w", &domain.LockLostError{Reason: r, NewHolder: &domain.Lock{},
			Err: errors.New("the renewal had not completed when the lock expired")})
		assert.ErrorIs(t, err, domain.ErrExpired, r.String())
		assert.Equal(t, r == domain.LostClosed, errors.Is(err, domain.ErrClosed), r.String())
		assert.Equal(t, r == domain.LostStoreFailing, errors.Is(err, domain.ErrUnavailable), r.String())
		assert.NotErrorIs(t, err, domain.ErrConflict, r.String())
	}
}

// A failure is permanent when no retry through the store as opened can
// succeed: by its kind, or marked so by the adapter; busy, unreachable,
// full and unclassified failures may pass, and are retried.
func TestIsPermanent(t *testing.T) {
	for kind, want := range map[domain.StoreErrorKind]bool{
		domain.StoreInternal: false, domain.StoreBusy: false, domain.StoreUnreachable: false, domain.StoreFull: false,
		domain.StoreReadOnly: true, domain.StoreSchema: true, domain.StoreCorrupt: true, domain.StoreTokensExhausted: true,
	} {
		err := fmt.Errorf("wrapped: %w", &domain.StoreError{Op: "renew", Kind: kind})
		assert.Equal(t, want, domain.IsPermanent(err), kind.String())
		assert.True(t, domain.IsPermanent(&domain.StoreError{Op: "renew", Kind: kind, Permanent: true}), kind.String())
	}
	assert.False(t, domain.IsPermanent(nil))
	assert.False(t, domain.IsPermanent(context.DeadlineExceeded))
	assert.False(t, domain.IsPermanent(&domain.LockExpiredError{}))
}
