package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests drive Main in the test process, with a mock clock and a time
// zone of their own; tests/cli runs the built binary end to end.

// start is where every test's mock clock begins.
var start = time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC)

// zone is the "local" time zone of human output in these tests: not UTC,
// so that a test can tell local time from UTC.
var zone = time.FixedZone("TST", 2*60*60)

// harness runs agents commands against a fresh database of its own.
type harness struct {
	t   *testing.T
	clk *clock.Mock
	env map[string]string
	db  string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	clk := clock.NewMock()
	clk.Set(start)
	db := filepath.Join(t.TempDir(), "agents.db")
	// AGENTS_CREATE: the tests begin with a database that acquire creates;
	// TestMain_CreateOnlyWhenAsked tests without it.
	return &harness{t: t, clk: clk, db: db, env: map[string]string{"AGENTS_DB": db, "AGENTS_CREATE": "1"}}
}

type result struct {
	code           int
	stdout, stderr string
}

func (h *harness) run(args ...string) result {
	h.t.Helper()
	var stdout, stderr bytes.Buffer
	m := &Main{Stdout: &stdout, Stderr: &stderr, Env: func(k string) string { return h.env[k] }, Clock: h.clk, LocalTime: true, Location: zone}
	code := m.Run(context.Background(), args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// mustRun runs a command that must succeed.
func (h *harness) mustRun(args ...string) result {
	h.t.Helper()
	r := h.run(args...)
	require.Equal(h.t, exitOK, r.code, "stderr: %s", r.stderr)
	return r
}

// decode parses stdout, which must hold exactly one JSON document.
// createStore creates the harness's database, with no lock in it, the way
// an operator does: only the commands that take a lock create one.
func (h *harness) createStore() {
	h.t.Helper()
	h.mustRun("locks", "acquire", "plan", "seed", "--owner", "seed")
	h.mustRun("locks", "release", "plan", "seed", "--owner", "seed")
}

func (r result) decode(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(r.stdout)))
	require.NoError(t, dec.Decode(v), "stdout: %s", r.stdout)
	require.False(t, dec.More(), "more than one JSON document on stdout: %s", r.stdout)
}

func TestMain_Usage(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"NoCommand", nil, "no command given"},
		{"UnknownCommand", []string{"frob"}, `unknown command "frob"`},
		{"UnknownLocksCommand", []string{"locks", "frob"}, `unknown command "frob" for "agents locks"`},
		{"LocksWithoutSubcommand", []string{"locks"}, "locks needs a subcommand"},
		{"UnknownFlag", []string{"locks", "list", "--bogus"}, "unknown flag: --bogus"},
		{"MissingArgument", []string{"locks", "acquire", "plan", "--owner", "a"}, "expected TYPE and ID, got 1 argument"},
		{"ExtraArgument", []string{"locks", "cleanup", "now"}, `expected no arguments, got "now"`},
		{"MissingOwner", []string{"locks", "acquire", "plan", "p1"}, "missing owner: pass --owner ID or set AGENTS_OWNER"},
		{"EmptyOwner", []string{"locks", "release-all", "--owner", ""}, "invalid owner_id: must not be empty"},
		{"BadType", []string{"locks", "acquire", "job", "p1", "--owner", "a"}, `"job" is not a resource type; use "plan" or "project"`},
		{"BadListType", []string{"locks", "list", "--type", "job"}, `--type "job" is not a resource type`},
		{"TTLTooShort", []string{"locks", "acquire", "plan", "p1", "--owner", "a", "--ttl", "4s"}, "the TTL must be from 5s to 1h"},
		{"TTLTooLong", []string{"locks", "renew", "plan", "p1", "--owner", "a", "--ttl", "3601"}, "the TTL must be from 5s to 1h"},
		{"TTLZero", []string{"locks", "acquire", "plan", "p1", "--owner", "a", "--ttl", "0"}, "omit --ttl for the default 5m"},
		{"TTLMalformed", []string{"locks", "acquire", "plan", "p1", "--owner", "a", "--ttl", "soon"}, `"soon" is neither a duration`},
		{"TimeoutWithoutWait", []string{"locks", "acquire", "plan", "p1", "--owner", "a", "--timeout", "5s"}, "--timeout bounds a wait: pass --wait with it"},
		{"TimeoutZero", []string{"locks", "acquire", "plan", "p1", "--owner", "a", "--wait", "--timeout", "0"}, "the timeout must be positive"},
		{"TimeoutMalformed", []string{"locks", "acquire", "plan", "p1", "--owner", "a", "--wait", "--timeout", "soon"}, `"soon" is neither a duration`},
		{"RunWithoutDashDash", []string{"locks", "run", "plan", "p1", "true"}, "expected TYPE and ID, then -- and the command to run"},
		{"RunWithoutCommand", []string{"locks", "run", "plan", "p1", "--"}, "expected TYPE and ID, then -- and the command to run"},
		{"RunWithoutID", []string{"locks", "run", "plan", "--", "true"}, "expected TYPE and ID, then -- and the command to run"},
		{"RunBadType", []string{"locks", "run", "job", "p1", "--", "true"}, `"job" is not a resource type`},
		{"RunEmptyOwner", []string{"locks", "run", "plan", "p1", "--owner", "", "--", "true"}, "invalid owner_id: must not be empty"},
		{"RunTimeoutWithoutWait", []string{"locks", "run", "plan", "p1", "--timeout", "5s", "--", "true"}, "--timeout bounds a wait"},
		{"RunNegativeGrace", []string{"locks", "run", "plan", "p1", "--grace", "-1s", "--", "true"}, "the grace period must not be negative"},
		{"RunTTLTooShort", []string{"locks", "run", "plan", "p1", "--ttl", "1s", "--", "true"}, "the TTL must be from 5s to 1h"},
		{"MemoryDatabase", []string{"--db", ":memory:", "locks", "list"}, "would give every run an empty store"},
		{"EmptyDatabase", []string{"--db", "", "locks", "list"}, "--db must not be empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			r := h.run(tc.args...)
			assert.Equal(t, exitUsage, r.code)
			assert.Contains(t, r.stderr, tc.want)
			assert.Empty(t, r.stdout)
			assert.NoFileExists(t, h.db, "a usage error must not touch the database")

			r = h.run(append([]string{"--json"}, tc.args...)...)
			var doc struct{ Error errorDoc }
			r.decode(t, &doc)
			assert.Equal(t, "validation", doc.Error.Code)
			assert.Contains(t, doc.Error.Message, tc.want)
		})
	}
	t.Run("JSONAfterBadFlag", func(t *testing.T) {
		r := newHarness(t).run("locks", "list", "--bogus", "--json")
		var doc struct{ Error errorDoc }
		r.decode(t, &doc)
		assert.Equal(t, "validation", doc.Error.Code)
	})
	for _, args := range [][]string{{"-h"}, {"help"}, {"locks", "--help"}, {"locks", "acquire", "-h"}, {"locks", "run", "-h"}} {
		t.Run("Help"+filepath.Join(args...), func(t *testing.T) {
			r := newHarness(t).run(args...)
			assert.Equal(t, exitOK, r.code)
			assert.Contains(t, r.stdout, "Usage: agents")
			assert.Empty(t, r.stderr)
		})
	}
}

func TestMain_FlagsAnywhere(t *testing.T) {
	h := newHarness(t)
	r := h.mustRun("--json", "--owner", "alice", "locks", "acquire", "plan", "p1")
	var l lockDoc
	r.decode(t, &l)
	assert.Equal(t, "alice", l.OwnerID)

	// Another resource: a re-entry of p1 with --ttl 90s would keep p1's
	// later expiry (the default 5 min), and show nothing of the flag.
	r = h.mustRun("locks", "acquire", "--ttl", "90s", "plan", "--json", "p9", "--owner=alice")
	r.decode(t, &l)
	assert.Equal(t, start.Add(90*time.Second).Format(jsonTime), l.ExpiresAt)

	t.Run("DashDashEndsFlags", func(t *testing.T) {
		r := h.mustRun("locks", "acquire", "--owner", "alice", "--", "plan", "-p2")
		assert.Contains(t, r.stdout, "plan/-p2")
	})
}

func TestMain_Owner(t *testing.T) {
	h := newHarness(t)
	h.env["AGENTS_OWNER"] = "env-owner"
	r := h.mustRun("locks", "acquire", "plan", "p1")
	assert.Contains(t, r.stdout, `for owner "env-owner"`)
	r = h.mustRun("locks", "acquire", "plan", "p2", "--owner", "flag-owner")
	assert.Contains(t, r.stdout, `for owner "flag-owner"`, "--owner wins over AGENTS_OWNER")

	t.Run("EnvDoesNotFilterList", func(t *testing.T) {
		var all []listedLock
		h.mustRun("--json", "locks", "list").decode(t, &all)
		assert.Len(t, all, 2)
	})
	t.Run("FlagFiltersList", func(t *testing.T) {
		var mine []listedLock
		h.mustRun("--json", "locks", "list", "--owner", "flag-owner").decode(t, &mine)
		require.Len(t, mine, 1)
		assert.Equal(t, "p2", mine[0].ResourceID)
	})
}

func TestMain_DefaultDatabase(t *testing.T) {
	t.Run("UnderXDGDataHome", func(t *testing.T) {
		h := newHarness(t)
		data := t.TempDir()
		h.env = map[string]string{"XDG_DATA_HOME": data, "HOME": t.TempDir()}
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "a")
		assertMode(t, filepath.Join(data, "cleveragents"), 0o700)
		assertMode(t, filepath.Join(data, "cleveragents", "agents.db"), 0o600)
	})
	t.Run("UnderHomeWhenXDGIsRelative", func(t *testing.T) {
		h := newHarness(t)
		home := t.TempDir()
		h.env = map[string]string{"XDG_DATA_HOME": "relative/dir", "HOME": home}
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "a")
		assertMode(t, filepath.Join(home, ".local", "share", "cleveragents", "agents.db"), 0o600)
	})
	t.Run("DiagnosticsCreatesNothing", func(t *testing.T) {
		h := newHarness(t)
		data := t.TempDir()
		h.env = map[string]string{"XDG_DATA_HOME": data}
		r := h.run("diagnostics")
		assert.Equal(t, exitFailure, r.code)
		assert.Contains(t, r.stdout, "there is no lock database yet at the default path "+filepath.Join(data, "cleveragents", "agents.db"))
		assert.NotContains(t, r.stdout, "check --db", "the user passed none")
		assert.NoDirExists(t, filepath.Join(data, "cleveragents"))
	})
	t.Run("NoHome", func(t *testing.T) {
		h := newHarness(t)
		h.env = map[string]string{}
		r := h.run("locks", "list")
		assert.Equal(t, exitUsage, r.code)
		assert.Contains(t, r.stderr, "pass --db PATH or set AGENTS_DB")
	})
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, want, fi.Mode().Perm(), path)
}

func TestMain_RedactsPassword(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	for _, db := range []string{
		"file:" + filepath.Join(dir, "missing", "x.db") + "?_auth_pass=s3cr3t",
		"file:" + filepath.Join(dir, "bad.db") + "?password=s3cr3t",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.db"), []byte("not a database"), 0o600))
		for _, args := range [][]string{{"locks", "list"}, {"diagnostics"}, {"--json", "diagnostics"}, {"--json", "locks", "cleanup"}} {
			r := h.run(append([]string{"--db", db}, args...)...)
			assert.Equal(t, exitFailure, r.code, "%v", args)
			assert.NotContains(t, r.stdout+r.stderr, "s3cr3t", "%v", args)
			assert.Contains(t, r.stdout+r.stderr, redacted, "%v", args)
		}
	}
}
