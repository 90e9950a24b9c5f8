package locktest

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// testNote checks that the note given at acquire is stored with the lock,
// on every path a store may take to write it, and read back everywhere.
func testNote(t *testing.T, newRepo NewRepository) {
	const note = "deploying v2 (ticket OPS-7) — élan"
	run(t, "StoredWithTheLock", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		l, err := f.Svc.Acquire(f.Ctx, "A", plan1, 0, application.WithNote(note))
		require.NoError(t, err)
		assert.Equal(t, note, l.Note, "the lock returned carries its note")
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, l, got, "the note is stored")
		assert.Equal(t, []domain.Lock{l}, f.All(t), "and listed")
	})
	run(t, "NoNote", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		l := f.MustAcquire(t, "A", plan1, 0)
		assert.Empty(t, l.Note)
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Empty(t, got.Note)
	})
	run(t, "OverAnExpiredLock", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		_, err := f.Svc.Acquire(f.Ctx, "A", plan1, 10*time.Second, application.WithNote("first"))
		require.NoError(t, err)
		f.Clock.Add(10 * time.Second)
		l, err := f.Svc.Acquire(f.Ctx, "B", plan1, 0, application.WithNote(note))
		require.NoError(t, err)
		assert.Equal(t, note, l.Note, "a change of hands stores the new holder's note")
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, l, got)
	})
	run(t, "ConflictCarriesIt", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		held, err := f.Svc.Acquire(f.Ctx, "A", plan1, 0, application.WithNote(note))
		require.NoError(t, err)
		for _, try := range []func() error{
			func() error { _, err := f.Svc.Acquire(f.Ctx, "B", plan1, 0, application.WithNote("mine")); return err },
			func() error {
				_, err := f.Svc.Take(f.Ctx, "B", plan1, application.AcquireOptions{Note: "mine"})
				return err
			},
		} {
			err := try()
			var ce *domain.LockConflictError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, held, ce.Holder, "the holder, its note included")
			assert.Contains(t, err.Error(), `"`+note+`"`, "the message shows the holder's note")
		}
		assert.Equal(t, []domain.Lock{held}, f.All(t), "a refusal writes nothing")
	})
	run(t, "ReentryAndRenewalKeepIt", func(t *testing.T) {
		// A note belongs to an acquisition (a token): a re-entry is the
		// same acquisition, so it keeps the note, whatever it passes.
		f := mustFixture(t, newRepo)
		first, err := f.Svc.Acquire(f.Ctx, "A", plan1, time.Hour, application.WithNote(note))
		require.NoError(t, err)
		again, err := f.Svc.Acquire(f.Ctx, "A", plan1, time.Hour, application.WithNote("another"))
		require.NoError(t, err)
		assert.Equal(t, first.Token, again.Token)
		assert.Equal(t, note, again.Note, "a re-entry keeps the note")
		renewed, err := f.Svc.Renew(f.Ctx, "A", plan1, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, note, renewed.Note, "a renewal keeps the note")
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, note, got.Note)
	})
	run(t, "Handle", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		h, err := f.Svc.Take(f.Ctx, "A", plan1, application.AcquireOptions{Note: note})
		require.NoError(t, err)
		assert.Equal(t, note, h.Lock().Note)
		l, err := h.Renew(f.Ctx)
		require.NoError(t, err)
		assert.Equal(t, note, l.Note, "a handle's renewal keeps the note")
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, note, got.Note)
	})
	run(t, "Bounds", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		longest := strings.Repeat("é", domain.MaxNoteBytes/2) // two bytes a rune
		l, err := f.Svc.Acquire(f.Ctx, "A", plan1, 0, application.WithNote(longest))
		require.NoError(t, err, "a note of MaxNoteBytes bytes")
		assert.Equal(t, longest, l.Note)
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, longest, got.Note, "stored whole")
		for name, bad := range map[string]string{
			"TooLong":     longest + "x",
			"InvalidUTF8": "a\xffb",
			"Newline":     "two\nlines",
			"Escape":      "red \x1b[31m",
			"C1":          "a\u0085b",
		} {
			_, err := f.Svc.Acquire(f.Ctx, "B", plan2, 0, application.WithNote(bad))
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve, name)
			assert.Equal(t, "note", ve.Field, name)
			_, err = f.Svc.Take(f.Ctx, "B", plan2, application.AcquireOptions{Note: bad})
			require.ErrorAs(t, err, &ve, name)
		}
		assert.Equal(t, []domain.Lock{l}, f.All(t), "a refused note writes nothing")
	})
}
