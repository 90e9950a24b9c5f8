package entstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

// formatTime must write exactly what time.Format writes with timeLayout,
// which parseTime reads back: the stored strings are compared in SQL.
func FuzzFormatTime(f *testing.F) {
	for _, t := range []time.Time{
		{},
		time.Date(2026, 12, 1, 9, 5, 7, 123456789, time.UTC),
		time.Date(1999, 1, 31, 23, 59, 59, 999999000, time.UTC),
		time.Date(2026, 3, 29, 2, 30, 0, 1000, time.FixedZone("CEST", 2*3600)),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		f.Add(t.Unix(), int64(t.Nanosecond()), 0)
	}
	f.Fuzz(func(t *testing.T, sec, nsec int64, offset int) {
		at := time.Unix(sec, nsec).In(time.FixedZone("", offset%(24*3600)))
		want := at.UTC().Format(timeLayout)
		got := FormatTime(at)
		require.Equal(t, want, got, "%v", at)
		if y := at.UTC().Year(); y >= 0 && y <= 9999 {
			back, err := ParseTime("expires_at", got)
			require.NoError(t, err)
			assert.True(t, back.Equal(at.Truncate(time.Microsecond)), "%v read back as %v", at, back)
		}
	})
}

// A driver's timeout that fires at the caller's deadline, a moment before
// the context's own timer, is the caller's deadline, not a store failure.
func TestExplain_ADeadlineThatPassedIsTheCallers(t *testing.T) {
	ctx, cancel := context.WithDeadline(context.WithoutCancel(context.Background()), time.Now().Add(-time.Millisecond))
	defer cancel()
	// A context whose timer has not fired yet: its deadline is past, and
	// its Err still nil, as for a moment after the deadline.
	early := deadlineOnly{ctx}
	storeFailure := errors.New("dial tcp 127.0.0.1:5432: i/o timeout")
	err := Explain(early, storeFailure, "read lock on plan/p", func(op string, err error) error {
		return &domain.StoreError{Op: op, Kind: domain.StoreUnreachable, Err: err}
	})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, domain.ErrUnavailable)
}

// deadlineOnly is a context whose deadline has passed but whose Err is
// still nil.
type deadlineOnly struct{ context.Context }

func (deadlineOnly) Err() error { return nil }
