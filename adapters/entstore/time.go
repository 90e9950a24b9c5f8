package entstore

import (
	"fmt"
	"time"

	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// timeLayout writes every stored instant: UTC, microseconds, always 27
// characters, so that string order is time order and "expires_at <= now"
// can be compared in SQL and use the index. The service truncates instants
// to microseconds before they get here, so nothing is lost.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// FormatTime writes t in timeLayout. It writes the digits itself: the
// leader of a SQLite batch formats two instants per acquire inside the
// transaction, where time.Format's interpretation of the layout was 5% of
// the time an acquire held the write lock. Years outside 0-9999, which
// the layout cannot hold in four digits, go through time.Format.
func FormatTime(t time.Time) string {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.Format(timeLayout)
	}
	hour, minute, sec := t.Clock()
	var b [len(timeLayout)]byte
	put := func(at, width, v int) {
		for i := at + width - 1; i >= at; i-- {
			b[i] = byte('0' + v%10)
			v /= 10
		}
	}
	put(0, 4, year)
	b[4] = '-'
	put(5, 2, int(month))
	b[7] = '-'
	put(8, 2, day)
	b[10] = 'T'
	put(11, 2, hour)
	b[13] = ':'
	put(14, 2, minute)
	b[16] = ':'
	put(17, 2, sec)
	b[19] = '.'
	put(20, 6, t.Nanosecond()/1000)
	b[26] = 'Z'
	return string(b[:])
}

// ParseTime reads s, a time as stored in column.
func ParseTime(column, s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("column %s holds %q, not a time in the form %s", column, s, timeLayout)
	}
	return t, nil
}

// ParseTimes sets l's times from their stored form.
func ParseTimes(l *domain.Lock, acquired, expires string) (err error) {
	if l.AcquiredAt, err = ParseTime(entlock.FieldAcquiredAt, acquired); err == nil {
		l.ExpiresAt, err = ParseTime(entlock.FieldExpiresAt, expires)
	}
	if err != nil {
		return &domain.StoreError{Op: "read lock", Kind: domain.StoreCorrupt, Err: err}
	}
	return nil
}
