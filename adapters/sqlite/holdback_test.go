package sqlite_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/cleveragents/locks/adapters/sqlite"
)

func TestHoldBack_PausesAtLeastAsLongAsAsked(t *testing.T) {
	start := time.Now()
	sqlite.HoldBack(2 * time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Millisecond)
}

// BenchmarkPause compares how long a pause of 200 µs really takes: a
// thread's nanosleep (HoldBack), against time.Sleep, whose runtime timers
// wake short sleeps about a millisecond late on an otherwise idle
// process. ns/op is the real pause.
func BenchmarkPause(b *testing.B) {
	const d = 200 * time.Microsecond
	b.Run("impl=HoldBack", func(b *testing.B) {
		for b.Loop() {
			sqlite.HoldBack(d)
		}
	})
	b.Run("impl=TimeSleep", func(b *testing.B) {
		for b.Loop() {
			time.Sleep(d)
		}
	})
}
