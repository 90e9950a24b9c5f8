//go:build linux

package main

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/tests/filelocks"
)

// The CLI's commands, run in a process that has the database open through
// an application connection, leave that connection's POSIX locks on the
// file in place: they never open or close a descriptor of the file
// themselves (see tests/sharedfile_test.go). Before the fix, diagnostics
// failed here: after diagnostics, this process no longer held the
// application connection's locks: database file held by pid 0.
func TestMain_KeepsTheApplicationsLocks(t *testing.T) {
	h := newHarness(t)
	h.createStore()
	dsn, err := sqlite.DSN(h.db, 0)
	require.NoError(t, err)
	app, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	defer app.Close()
	_, err = app.Exec("CREATE TABLE app (id INTEGER PRIMARY KEY)")
	require.NoError(t, err)
	filelocks.RequireHeld(t, h.db, "opening the application's connection")

	for _, args := range [][]string{
		{"diagnostics"},
		{"--json", "diagnostics"},
		{"locks", "list"},
		{"locks", "list", "--all"},
		{"locks", "show", "plan", "p1"},
		{"locks", "acquire", "plan", "p1", "--owner", "cli"},
		{"locks", "release", "plan", "p1", "--owner", "cli"},
		{"locks", "cleanup"},
	} {
		h.run(args...) // the outcome is for other tests; the file's locks are this one's
		filelocks.RequireHeld(t, h.db, "agents "+strings.Join(args, " "))
	}
}
