package entstore

import (
	"fmt"
	"time"
)

// timeLayout writes every stored instant: UTC, microseconds, always 27
// characters, so that string order is time order and "expires_at <= now"
// can be compared in SQL and use the index. The service truncates instants
// to microseconds before they get here, so nothing is lost.
const timeLayout = "2006-01-02T15:04:05.000000Z"

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func parseTime(column, s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("column %s holds %q, not a time in the form %s", column, s, timeLayout)
	}
	return t, nil
}
