package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain_Diagnostics(t *testing.T) {
	t.Run("StaleLocksWarnAndCleanupReportsTheSameCount", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "5s")
		h.mustRun("locks", "acquire", "plan", "p2", "--owner", "bob")
		h.clk.Add(10 * time.Second)

		r := h.mustRun("--json", "diagnostics")
		var rep report
		r.decode(t, &rep)
		assert.True(t, rep.OK, "a warning does not fail diagnostics")
		stale := checkNamed(t, rep, "stale_locks")
		assert.Equal(t, statusWarn, stale.Status)
		require.NotNil(t, stale.Count)
		assert.Equal(t, 1, *stale.Count)
		assert.Contains(t, stale.Detail, "cleanup has not run")
		assert.Contains(t, stale.Detail, "agents locks cleanup --db "+h.db)

		var n countDoc
		h.mustRun("--json", "locks", "cleanup").decode(t, &n)
		assert.Equal(t, *stale.Count, n.Count)
		h.mustRun("--json", "diagnostics").decode(t, &rep)
		assert.Equal(t, statusOK, checkNamed(t, rep, "stale_locks").Status)
	})
	t.Run("ActiveLocksNamesTheOldest", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "1h")
		h.clk.Add(time.Minute)
		h.mustRun("locks", "acquire", "plan", "p0", "--owner", "bob")
		h.clk.Add(time.Minute)

		var rep report
		h.mustRun("--json", "diagnostics").decode(t, &rep)
		active := checkNamed(t, rep, "active_locks")
		assert.Equal(t, statusOK, active.Status)
		require.NotNil(t, active.Count)
		assert.Equal(t, 2, *active.Count)
		require.NotNil(t, active.Oldest)
		assert.Equal(t, "alice", active.Oldest.OwnerID)
		assert.Contains(t, active.Detail, `"alice" since 2026-11-29 21:00:00 TST (2m ago)`)
	})
	t.Run("HumanReport", func(t *testing.T) {
		h := newHarness(t)
		h.createStore()
		r := h.mustRun("diagnostics")
		assert.Regexp(t, `(?m)^  ok +database +`, r.stdout)
		assert.Regexp(t, `(?m)^  ok +schema +migration m4_001_concurrency_locks is applied$`, r.stdout)
		assert.Regexp(t, `(?m)^  ok +stale_locks +`, r.stdout)
		assert.Regexp(t, `(?m)^  ok +active_locks +no locks are held$`, r.stdout)
		assert.Contains(t, r.stdout, "All checks passed.")
	})
	t.Run("MissingFileFailsAndIsNotCreated", func(t *testing.T) {
		h := newHarness(t)
		r := h.run("--json", "diagnostics")
		assert.Equal(t, exitFailure, r.code)
		var rep report
		r.decode(t, &rep)
		assert.False(t, rep.OK)
		require.Len(t, rep.Checks, 5)
		assert.Equal(t, statusFail, checkNamed(t, rep, "database").Status)
		assert.Contains(t, checkNamed(t, rep, "database").Detail, "diagnostics never creates one")
		assert.NoFileExists(t, h.db)
	})
	// Root can write any file and in any directory: as root, these two run
	// as another user.
	t.Run("ReadOnlyFileFailsDatabase", func(t *testing.T) {
		if !runsUnprivileged(t) {
			return
		}
		h := newHarness(t)
		h.createStore()
		require.NoError(t, os.Chmod(h.db, 0o400))
		r := h.run("--json", "diagnostics")
		assert.Equal(t, exitFailure, r.code)
		var rep report
		r.decode(t, &rep)
		database := checkNamed(t, rep, "database")
		t.Logf("database: %s: %s", database.Status, database.Detail)
		assert.Equal(t, statusFail, database.Status)
		assert.Contains(t, database.Detail, "lock store is read-only; make the database file and its directory writable")
		assert.Equal(t, statusOK, checkNamed(t, rep, "schema").Status, "a read-only file can still be inspected")
	})
	t.Run("UnreadableFileFailsDatabase", func(t *testing.T) {
		if !runsUnprivileged(t) {
			return
		}
		h := newHarness(t)
		h.createStore()
		require.NoError(t, os.Chmod(h.db, 0o200))
		r := h.run("--json", "diagnostics")
		assert.Equal(t, exitFailure, r.code)
		var rep report
		r.decode(t, &rep)
		database := checkNamed(t, rep, "database")
		t.Logf("database: %s: %s", database.Status, database.Detail)
		assert.Equal(t, statusFail, database.Status)
		assert.Contains(t, database.Detail, "lock store is read-only")
		assert.Contains(t, database.Detail, "permission denied", "the cause, not SQLite's \"unable to open\"")
	})
	t.Run("ReadOnlyDirectoryFailsDatabase", func(t *testing.T) {
		if !runsUnprivileged(t) {
			return
		}
		h := newHarness(t)
		h.createStore()
		dir := filepath.Dir(h.db)
		require.NoError(t, os.Chmod(dir, 0o500))
		t.Cleanup(func() { os.Chmod(dir, 0o700) })
		r := h.run("--json", "diagnostics")
		assert.Equal(t, exitFailure, r.code)
		var rep report
		r.decode(t, &rep)
		database := checkNamed(t, rep, "database")
		t.Logf("database: %s: %s", database.Status, database.Detail)
		assert.Equal(t, statusFail, database.Status)
		assert.Contains(t, database.Detail, "write in directory "+dir)
	})
	t.Run("NotADatabase", func(t *testing.T) {
		h := newHarness(t)
		require.NoError(t, os.WriteFile(h.db, []byte("hello"), 0o600))
		r := h.run("diagnostics")
		assert.Equal(t, exitFailure, r.code)
		assert.Contains(t, r.stdout, "is not a SQLite database")
		assert.Contains(t, r.stderr, "a check failed")
		entries, err := os.ReadDir(filepath.Dir(h.db))
		require.NoError(t, err)
		assert.Len(t, entries, 1, "no -wal or -shm file beside it")
	})
}

func checkNamed(t *testing.T, rep report, name string) check {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	require.Failf(t, "no check", "%s in %+v", name, rep)
	return check{}
}

// writable gives cleanup a --db it accepts: diagnostics may read through a
// read-only URI, which cleanup refuses.
func TestWritable(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/agents/locks.db":                       "/var/lib/agents/locks.db",
		"file:k.db?mode=ro":                              "file:k.db",
		"file:k.db?immutable=1":                          "file:k.db",
		"file:k.db?mode=ro&_busy_timeout=100":            "file:k.db?_busy_timeout=100",
		"file:k.db?_pragma=query_only(1)":                "file:k.db",
		"file:k.db?_pragma=query_only(1)&_pragma=foo(2)": "file:k.db?_pragma=foo%282%29",
		"file:k.db?mode=rwc":                             "file:k.db?mode=rwc",
		"postgres://u@h/db?search_path=x":                "postgres://u@h/db?search_path=x",
	} {
		assert.Equal(t, want, writable(in), in)
	}
}

// A deadline in whole seconds past what a duration holds is too long, not
// "not positive".
func TestParseDeadline(t *testing.T) {
	_, err := parseDeadline("18446744074")
	require.ErrorContains(t, err, "longer than the longest deadline, 9223372036 seconds")
	_, err = parseDeadline("-5")
	require.ErrorContains(t, err, "must be positive")
	d, err := parseDeadline("9223372036")
	require.NoError(t, err)
	assert.Equal(t, 9223372036*time.Second, d)
}
