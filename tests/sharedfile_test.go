//go:build linux

package tests

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/filelocks"
)

// openApplication opens the database at path as an embedder does, with
// its own *sql.DB (docs/lifecycle.md), creates its table and keeps one
// connection open, which holds SQLite's WAL-mode locks on the file and its
// -shm for as long as it is open.
func openApplication(t *testing.T, path string) *sql.DB {
	t.Helper()
	dsn, err := sqlite.DSN(path, 0)
	require.NoError(t, err)
	app, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { app.Close() })
	app.SetMaxIdleConns(4)
	_, err = app.Exec("CREATE TABLE IF NOT EXISTS app (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
	require.NoError(t, err)
	_, err = app.Exec("INSERT INTO app (note) VALUES ('before')")
	require.NoError(t, err)
	return app
}

// The module never opens or closes a descriptor of the database file (or
// its -wal or -shm) itself: closing one would drop every POSIX lock the
// process holds on the file, those of the application's own connections
// included, after which another process (the sqlite3 shell) deletes the
// -wal and -shm under them, or takes the file exclusively, and this
// process commits into an unlinked WAL. Before the fix, locks.Open
// (sqlite.CheckWritable opened the file O_WRONLY and closed it) failed
// here: after locks.Open, this process no longer held the application
// connection's locks: database file held by pid 0, -shm by pid <this pid>;
// and, going on past that, the shell deleted -wal and -shm, a shell with
// locking_mode=EXCLUSIVE was let in, and the shell did not see the
// application's next commit.
// The CLI's read-only commands are checked in cmd/agents.
func TestSharedFile_ModuleKeepsTheApplicationsLocks(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	app := openApplication(t, path)
	// A read transaction in progress, as well as the idle connections.
	tx, err := app.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	require.NoError(t, err)
	defer tx.Rollback()
	var n int
	require.NoError(t, tx.QueryRow("SELECT count(*) FROM app").Scan(&n))
	filelocks.RequireHeld(t, path, "opening the application's connection") // the probe sees them at all

	c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "app"})
	require.NoError(t, err)
	filelocks.RequireHeld(t, path, "locks.Open")
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}
	_, err = c.Locks.Acquire(ctx, "app", ref, 0)
	require.NoError(t, err)
	_, err = c.Locks.Release(ctx, "app", ref)
	require.NoError(t, err)
	filelocks.RequireHeld(t, path, "an acquire and a release")

	require.NoError(t, sqlite.CheckWritable(path))
	filelocks.RequireHeld(t, path, "sqlite.CheckWritable")
	ro, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	_, err = ro.Schema(ctx)
	require.NoError(t, err)
	require.NoError(t, ro.Close())
	filelocks.RequireHeld(t, path, "sqlite.OpenReadOnly and its Close")

	// A second container on the same file, as a second component of the
	// application may open, and both closed.
	c2, err := locks.Open(ctx, locks.Config{Database: path, Owner: "other"})
	require.NoError(t, err)
	filelocks.RequireHeld(t, path, "a second locks.Open")
	require.NoError(t, c2.Close())
	require.NoError(t, c.Close())
	filelocks.RequireHeld(t, path, "Container.Close")
	require.NoError(t, tx.Rollback())
	filelocks.RequireHeld(t, path, "the end of the application's read transaction")

	requireShellLeavesTheFile(t, app, path)
}

// requireShellLeavesTheFile runs the stock sqlite3 shell on the file, where
// installed: a plain SELECT must leave the -wal and -shm in place (only the
// last connection deletes them), and a shell asking for the file
// exclusively must not get it.
func requireShellLeavesTheFile(t *testing.T, app *sql.DB, path string) {
	t.Helper()
	shell, err := exec.LookPath("sqlite3")
	if err != nil {
		t.Log("no sqlite3 shell: only the probe checked the locks")
		return
	}
	out, err := exec.Command(shell, path, "SELECT count(*) FROM app").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, suffix := range []string{"-wal", "-shm"} {
		_, err := os.Stat(path + suffix)
		assert.NoError(t, err, "the sqlite3 shell deleted %s under the application's open connection", suffix)
	}
	out, err = exec.Command(shell, "-cmd", ".timeout 200", path,
		"PRAGMA locking_mode=EXCLUSIVE; INSERT INTO app (note) VALUES ('exclusive');").CombinedOutput()
	// The application's connections hold the file shared: a shell that
	// wants it exclusively must wait, and give up.
	assert.Error(t, err, "a shell with locking_mode=EXCLUSIVE was let in while the application has the file open: %s", out)
	assert.Contains(t, string(out), "database is locked")
	var n int
	require.NoError(t, app.QueryRow("SELECT count(*) FROM app WHERE note = 'exclusive'").Scan(&n))
	assert.Zero(t, n, "the refused shell's insert is not there")
	_, err = app.Exec("INSERT INTO app (note) VALUES ('after')")
	require.NoError(t, err)
	out, err = exec.Command(shell, path, "SELECT count(*) FROM app WHERE note = 'after'").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "1\n", string(out), "the shell does not see the application's commit")
}
