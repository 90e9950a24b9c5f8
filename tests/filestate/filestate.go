// Package filestate reads what a refusal must leave as it was in a SQLite
// database's directory, for the tests that check that the module and the
// CLI change nothing in a file they refuse.
package filestate

import (
	"crypto/sha256"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

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
