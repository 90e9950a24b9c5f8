package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The embedder's logger and meter provider see what happens to locks: a
// scripted acquire, conflict, takeover, renew and release, read back
// through the SDK's manual reader and a JSON log.
func TestContainer_Telemetry(t *testing.T) {
	ctx := context.Background()
	mc := newMock()
	reader := sdkmetric.NewManualReader()
	var logs bytes.Buffer
	c := MustOpen(t, locks.Config{
		Database:      locks.MemoryDatabase,
		Owner:         "A",
		Clock:         mc,
		Logger:        slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})

	_, err := c.Locks.Acquire(ctx, "A", plan1, 10*time.Second)
	require.NoError(t, err)
	_, err = c.Locks.Acquire(ctx, "B", plan1, 0)
	require.ErrorIs(t, err, domain.ErrConflict)
	mc.Add(10 * time.Second)
	b, err := c.Locks.Take(ctx, "B", plan1, application.AcquireOptions{TTL: time.Minute})
	require.NoError(t, err, "B takes the expired lock over")
	_, err = b.Renew(ctx)
	require.NoError(t, err)
	mc.Add(30 * time.Second)
	_, err = b.Release(ctx)
	require.NoError(t, err)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}

	events := map[string]int64{}
	for _, dp := range got["locks.events"].(metricdata.Sum[int64]).DataPoints {
		ev, _ := dp.Attributes.Value("event")
		events[ev.AsString()] += dp.Value
	}
	assert.Equal(t, map[string]int64{"acquired": 1, "refused": 1, "taken_over": 1, "renewed": 1, "released": 1}, events)
	assert.Equal(t, int64(1), got["locks.takeovers"].(metricdata.Sum[int64]).DataPoints[0].Value)
	hold := got["locks.hold.duration"].(metricdata.Histogram[float64]).DataPoints
	require.Len(t, hold, 1)
	assert.Equal(t, 30.0, hold[0].Sum, "B held the lock for 30 s of the mock clock")
	var acquires uint64
	for _, dp := range got["locks.acquire.duration"].(metricdata.Histogram[float64]).DataPoints {
		acquires += dp.Count
	}
	assert.Equal(t, uint64(3), acquires)
	active := got["locks.active"].(metricdata.Gauge[int64]).DataPoints
	require.Len(t, active, 1)
	assert.Zero(t, active[0].Value, "nothing is held after the release")

	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		lines = append(lines, m)
	}
	require.Len(t, lines, 5)
	assert.Equal(t, "lock taken_over", lines[2]["msg"])
	assert.Equal(t, "A", lines[2]["previous_owner"], "the takeover names the previous holder")
	assert.Equal(t, "lock refused", lines[1]["msg"])
	assert.Equal(t, "A", lines[1]["holder_owner"])
}

// A lock's note is in its events, so that a log says what the holder
// does: the acquired lock's, the holder's in a refusal, the previous
// holder's in a takeover.
func TestContainer_TelemetryShowsNotes(t *testing.T) {
	ctx := context.Background()
	mc := newMock()
	var logs bytes.Buffer
	c := MustOpen(t, locks.Config{
		Database: locks.MemoryDatabase,
		Owner:    "A",
		Clock:    mc,
		Logger:   slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	_, err := c.Locks.Acquire(ctx, "A", plan1, 10*time.Second, application.WithNote("migrating"))
	require.NoError(t, err)
	_, err = c.Locks.Acquire(ctx, "B", plan1, 0)
	require.ErrorIs(t, err, domain.ErrConflict)
	mc.Add(10 * time.Second)
	_, err = c.Locks.Take(ctx, "B", plan1, application.AcquireOptions{Note: "rebuilding"})
	require.NoError(t, err)

	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		lines = append(lines, m)
	}
	require.Len(t, lines, 3)
	assert.Equal(t, "migrating", lines[0]["note"], "acquired")
	assert.Equal(t, "migrating", lines[1]["holder_note"], "refused")
	assert.Equal(t, "rebuilding", lines[2]["note"], "taken over")
	assert.Equal(t, "migrating", lines[2]["previous_note"])
}
