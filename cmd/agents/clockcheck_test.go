package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/tests/testdb"
)

// skewed is this host's real clock, off by skew.
type skewed struct{ skew time.Duration }

func (c skewed) Now() time.Time { return time.Now().Add(c.skew) }

// On PostgreSQL, diagnostics measures this host's clock against the
// server's: ok when they agree, warn when the host is far off.
func TestMain_Diagnostics_ClockCheck(t *testing.T) {
	dsn := testdb.Postgres(t)
	h := newHarness(t)
	h.env["AGENTS_DB"] = dsn
	h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
	for _, tc := range []struct {
		skew   time.Duration
		status string
		says   string
	}{
		{0, "ok", "locks expire on the server's time"},
		{2 * time.Minute, "warn", "ahead of the server's"},
		{-2 * time.Minute, "warn", "behind the server's"},
	} {
		var stdout, stderr bytes.Buffer
		m := &Main{Stdout: &stdout, Stderr: &stderr, Env: func(k string) string { return h.env[k] }, Clock: skewed{tc.skew}, Location: zone}
		m.Run(context.Background(), []string{"--json", "diagnostics"})
		var rep report
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "stdout: %s\nstderr: %s", stdout.String(), stderr.String())
		var clockCheck *check
		for i := range rep.Checks {
			if rep.Checks[i].Name == "clock" {
				clockCheck = &rep.Checks[i]
			}
		}
		require.NotNil(t, clockCheck, "skew %s", tc.skew)
		assert.Equal(t, tc.status, clockCheck.Status, "skew %s: %s", tc.skew, clockCheck.Detail)
		assert.Contains(t, clockCheck.Detail, tc.says)
	}
}
