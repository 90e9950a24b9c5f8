// Package filestate reads what a refusal must leave as it was in a SQLite
// database's directory, for the tests that check that the module and the
// CLI change nothing in a file they refuse.
package filestate

import (
	"crypto/sha256"
	"database/sql"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// State is each regular file's digest in a directory, and the journal
// mode of the database file in it.
type State struct {
	Digests map[string][32]byte
	Journal string
}

// Of reads the state of dir, whose database file is db. It reads the
// files only while no connection of this process has them open.
func Of(t testing.TB, dir, db string) State {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	st := State{Digests: map[string][32]byte{}}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		st.Digests[e.Name()] = sha256.Sum256(b)
	}
	st.Journal = JournalMode(t, db)
	return st
}

// JournalMode reads a SQLite file's journal mode from its header (bytes
// 18 and 19 are 2 in WAL mode, 1 in a rollback journal mode), without
// SQLite, which could create -wal and -shm files to read it: "wal",
// "rollback", or "not a database".
func JournalMode(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	switch {
	case len(b) < 100 || string(b[:16]) != "SQLite format 3\x00":
		return "not a database"
	case b[18] == 2 && b[19] == 2:
		return "wal"
	default:
		return "rollback"
	}
}

// AppFile makes a SQLite file at path as another application would, in
// the default rollback journal mode, with what the statements leave.
func AppFile(t testing.TB, path, statements string) {
	t.Helper()
	sdb, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(delete)")
	require.NoError(t, err)
	_, err = sdb.Exec(statements)
	require.NoError(t, err)
	require.NoError(t, sdb.Close())
}

// WALWithoutIndex makes a SQLite file at path in WAL mode whose commits
// (what the statements leave) are all in path-wal, not yet copied into
// the file, and no path-shm: the files of a program that was stopped, or
// copied, without its index. It copies a scratch database's files while
// a connection holds them, as a backup of a running program would.
func WALWithoutIndex(t testing.TB, path, statements string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src.db")
	sdb, err := sql.Open("sqlite", "file:"+src+"?_pragma=journal_mode(wal)&_pragma=wal_autocheckpoint(0)")
	require.NoError(t, err)
	defer sdb.Close()
	sdb.SetMaxOpenConns(1)
	_, err = sdb.Exec(statements)
	require.NoError(t, err)
	copyFile(t, src, path)
	copyFile(t, src+"-wal", path+"-wal")
}

// HotJournal makes a SQLite file at path in the rollback journal mode as
// a program leaves it that stopped in the middle of a transaction: some
// pages of the file already overwritten, and their old contents in
// path-journal, a "hot" journal that the next connection able to write
// rolls back. It copies a scratch database's files during the
// transaction (whose small cache spills the changed pages into the file).
func HotJournal(t testing.TB, path string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src.db")
	sdb, err := sql.Open("sqlite", "file:"+src+"?_pragma=journal_mode(delete)&_pragma=cache_size(2)")
	require.NoError(t, err)
	defer sdb.Close()
	sdb.SetMaxOpenConns(1)
	_, err = sdb.Exec("CREATE TABLE notes (body BLOB); " +
		"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 400) INSERT INTO notes SELECT randomblob(500) FROM c")
	require.NoError(t, err)
	tx, err := sdb.Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.Exec("UPDATE notes SET body = randomblob(500)")
	require.NoError(t, err)
	copyFile(t, src, path)
	copyFile(t, src+"-journal", path+"-journal")
}

// copyFile copies the file from to a new file to, with mode 0600.
func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NotEmpty(t, b, from)
	require.NoError(t, os.WriteFile(to, b, 0o600))
}

// BlockedOnFIFO runs call, which opens or reads a database beside a FIFO
// planted at fifo, and returns its error. A call still blocked after a
// generous bound fails the test, saying so with what, once the FIFO has
// been opened from the other end so that the blocked call, and the test,
// can end.
func BlockedOnFIFO(t testing.TB, fifo, what string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		for i := 0; i < 50; i++ {
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			select {
			case <-done:
				t.Fatal(what)
			case <-time.After(100 * time.Millisecond):
			}
		}
		t.Fatal(what + ", and stays blocked")
		return nil
	}
}
