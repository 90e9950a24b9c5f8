package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/cleveragents/locks/domain"
)

func TestRelative(t *testing.T) {
	now := start
	cases := []struct {
		offset time.Duration
		want   string
	}{
		{4*time.Minute + 12*time.Second, "in 4m12s"},
		{-12 * time.Second, "12s ago"},
		{5 * time.Minute, "in 5m"},
		{time.Hour, "in 1h"},
		{-(time.Hour + 12*time.Second), "1h0m12s ago"},
		{400 * time.Millisecond, "now"},
		{1600 * time.Millisecond, "in 2s"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			assert.Equal(t, tc.want, relative(now.Add(tc.offset), now))
		})
	}
}

func TestPrintable(t *testing.T) {
	assert.Equal(t, "plan/p1", printable("plan/p1"))
	assert.Equal(t, "plan/été", printable("plan/été"))
	assert.Equal(t, `"a\tb"`, printable("a\tb"))
	assert.Equal(t, `"\x1b[31mred"`, printable("\x1b[31mred"))
}

func TestExitCode(t *testing.T) {
	cases := []struct {
		name string
		err  error
		exit int
		code string
	}{
		{"Conflict", fmt.Errorf("acquire: %w", &domain.LockConflictError{}), exitConflict, "conflict"},
		{"Expired", &domain.LockExpiredError{}, exitExpired, "expired"},
		{"Validation", &domain.ValidationError{Field: "ttl"}, exitUsage, "validation"},
		{"Usage", usagef("no command given"), exitUsage, "validation"},
		{"Store", &domain.StoreError{Kind: domain.StoreCorrupt}, exitFailure, "internal"},
		{"ChecksFailed", errChecksFailed, exitFailure, "internal"},
		{"Canceled", context.Canceled, exitFailure, "internal"},
		{"Unknown", errors.New("boom"), exitFailure, "internal"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			exit, code := exitCode(tc.err)
			assert.Equal(t, tc.exit, exit)
			assert.Equal(t, tc.code, code)
		})
	}
}

func TestSecrets(t *testing.T) {
	assert.Empty(t, secrets("/var/lib/agents/agents.db"))
	assert.Empty(t, secrets("file:/var/lib/agents.db?_busy_timeout=10000"))
	assert.Contains(t, secrets("file:/x.db?_auth_user=u&_auth_pass=p%40ss"), "p@ss")
	assert.Contains(t, secrets("file:/x.db?_auth_user=u&_auth_pass=p%40ss"), "p%40ss")
	assert.Contains(t, secrets("postgres://user:hunter2@host/db"), "hunter2")
}
