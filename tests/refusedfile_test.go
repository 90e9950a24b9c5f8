//go:build unix

package tests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/filestate"
)

// A file that locks.Open refuses is left byte for byte as it was: its
// digest, its journal mode, and no file beside it that was not there.

// lockFile makes a lock database at path, closed, holding one lock.
func lockFile(t *testing.T, path string) {
	t.Helper()
	c, err := locks.Open(context.Background(), locks.Config{Database: path, Owner: "ghost", KeepLocksOnClose: true})
	require.NoError(t, err)
	_, err = c.Locks.Acquire(context.Background(), "ghost", stressResources[0], 0)
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

func TestRefusedFile_Unchanged(t *testing.T) {
	cases := []struct {
		name string
		// make makes the file in dir and returns what Open is given, and
		// the file it names.
		make func(t *testing.T, dir string) (database, file string)
		// check checks the refusal.
		check func(t *testing.T, err error)
	}{
		{"NotADatabase", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "notes.txt")
			require.NoError(t, os.WriteFile(p, []byte("these are not the locks you are looking for\n"), 0o600))
			return p, p
		}, func(t *testing.T, err error) {
			assert.True(t, domain.IsStoreKind(err, domain.StoreCorrupt), "%v", err)
		}},
		{"ALocksTableOfItsOwn", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.AppFile(t, p, "CREATE TABLE locks (name TEXT, holder TEXT); INSERT INTO locks VALUES ('door', 'ann')")
			return p, p
		}, checkForeignLocksTable},
		{"ALocksTableAndOtherTables", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.AppFile(t, p, "CREATE TABLE users (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT); "+
				"CREATE TABLE locks (name TEXT, holder TEXT); INSERT INTO users (name) VALUES ('ann')")
			return p, p
		}, checkForeignLocksTable},
		{"ALocksTableOfTheStoresShapeMadeByHand", func(t *testing.T, dir string) (string, string) {
			// The shape of the store's table, without its migration's
			// record: made by hand, or by another program.
			p := filepath.Join(dir, "app.sqlite")
			filestate.AppFile(t, p, "CREATE TABLE `locks` (`id` integer NOT NULL PRIMARY KEY AUTOINCREMENT, `owner_id` varchar(255) NOT NULL, "+
				"`resource_type` varchar(50) NOT NULL, `resource_id` varchar(255) NOT NULL, `acquired_at` varchar(30) NOT NULL, `expires_at` varchar(30) NOT NULL)")
			return p, p
		}, checkForeignLocksTable},
		// SQLite's names are case-insensitive, and tables, views, indexes
		// and triggers share one namespace: any object named as one that
		// the migration creates makes it fail, after the journal switch.
		{"ALocksTableInMixedCase", appFile("CREATE TABLE Locks (a, b)"), checkForeignLocksTable},
		{"ALocksTableInCapitals", appFile(`CREATE TABLE "LOCKS" (a)`), checkForeignLocksTable},
		{"AViewNamedLocks", appFile("CREATE TABLE t (a); CREATE VIEW locks AS SELECT a FROM t"), checkForeignObject("view locks")},
		{"AnIndexNamedLocks", appFile("CREATE TABLE t (a); CREATE INDEX locks ON t (a)"), checkForeignObject("index locks")},
		{"AnIndexNamedAsTheStores", appFile("CREATE TABLE t (a); CREATE INDEX lock_owner_id ON t (a)"), checkForeignObject("index lock_owner_id")},
		{"AViewNamedAsTheStoresIndex", appFile("CREATE VIEW lock_expires_at AS SELECT 1 AS one"), checkForeignObject("view lock_expires_at")},
		{"AViewNamedAsTheVersionTable", appFile("CREATE VIEW LOCKS_SCHEMA_VERSION AS SELECT 1 AS one"), checkForeignObject("view LOCKS_SCHEMA_VERSION")},
		// Reading these through a connection that may write would change
		// them: copy the commits of the -wal file into the file, or roll
		// the journal back.
		{"WALWithoutItsIndex", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.WALWithoutIndex(t, p, "CREATE TABLE locks (a, b); INSERT INTO locks VALUES (1, 2)")
			return p, p
		}, checkWALWithoutIndex},
		{"WALWithoutItsIndexOtherTables", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.WALWithoutIndex(t, p, "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me')")
			return p, p
		}, checkWALWithoutIndex},
		{"HotJournal", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "app.sqlite")
			filestate.HotJournal(t, p)
			return p, p
		}, checkHotJournal},
		{"ReadOnlyURI", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "agents.db")
			lockFile(t, p)
			return "file:" + p + "?mode=ro", p
		}, func(t *testing.T, err error) {
			assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%v", err)
		}},
		{"HardLinked", func(t *testing.T, dir string) (string, string) {
			p := filepath.Join(dir, "agents.db")
			lockFile(t, p)
			require.NoError(t, os.Link(p, filepath.Join(dir, "other.db")))
			return filepath.Join(dir, "other.db"), p
		}, func(t *testing.T, err error) { checkHardLinked(t, err, 2) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			database, file := tc.make(t, dir)
			before := filestate.Of(t, dir, file)
			c, err := locks.Open(context.Background(), locks.Config{Database: database, Owner: "op"})
			if err == nil {
				c.Close()
			}
			require.Error(t, err, "Open must refuse the file")
			require.ErrorIs(t, err, domain.ErrUnavailable)
			tc.check(t, err)
			assert.Equal(t, before, filestate.Of(t, dir, file), "a refused file is left as it was: %v", err)
		})
	}
}

// checkForeignLocksTable checks the refusal of a file with a locks table
// that the store's migration did not create.
func checkForeignLocksTable(t *testing.T, err error) {
	t.Helper()
	assert.True(t, domain.IsStoreKind(err, domain.StoreSchema), "%v", err)
	assert.Contains(t, err.Error(), "a table named locks that the lock store did not create")
	assert.Contains(t, err.Error(), "point the service at a lock database of its own")
	assert.NotContains(t, err.Error(), "already exists", "the refusal comes before any statement that writes")
}

// appFile makes, for TestRefusedFile_Unchanged, a file app.sqlite of
// another application with what the statements leave.
func appFile(statements string) func(t *testing.T, dir string) (string, string) {
	return func(t *testing.T, dir string) (string, string) {
		p := filepath.Join(dir, "app.sqlite")
		filestate.AppFile(t, p, statements)
		return p, p
	}
}

// checkForeignObject checks the refusal of a file with an object named as
// one that the store's migration creates (what: its type and name).
func checkForeignObject(what string) func(t *testing.T, err error) {
	return func(t *testing.T, err error) {
		t.Helper()
		assert.True(t, domain.IsStoreKind(err, domain.StoreSchema), "%v", err)
		assert.ErrorIs(t, err, sqlite.ErrForeignSchemaObject)
		assert.Contains(t, err.Error(), what)
		assert.Contains(t, err.Error(), "point the service at a lock database of its own")
		assert.NotContains(t, err.Error(), "already exists", "the refusal comes before any statement that writes")
	}
}

// checkWALWithoutIndex checks the refusal of a WAL file whose -wal holds
// commits and whose -shm is missing.
func checkWALWithoutIndex(t *testing.T, err error) {
	t.Helper()
	assert.ErrorIs(t, err, sqlite.ErrWALWithoutIndex)
	assert.Contains(t, err.Error(), "-shm")
	assert.Contains(t, err.Error(), "the file was left as it was")
}

// checkHotJournal checks the refusal of a file whose -journal is hot: a
// program stopped in the middle of a transaction.
func checkHotJournal(t *testing.T, err error) {
	t.Helper()
	assert.ErrorIs(t, err, sqlite.ErrHotJournal)
	assert.Contains(t, err.Error(), "-journal")
	assert.Contains(t, err.Error(), "stopped in the middle of a transaction")
	assert.NotContains(t, err.Error(), "read-only")
	assert.NotContains(t, err.Error(), "writable")
}

// checkHardLinked checks the refusal of a file with more than one name.
func checkHardLinked(t *testing.T, err error, links uint64) {
	t.Helper()
	var le *sqlite.LinkedFileError
	require.True(t, errors.As(err, &le), "a *sqlite.LinkedFileError: %v", err)
	assert.Equal(t, links, le.Links)
	assert.Contains(t, err.Error(), "hard links")
	assert.Contains(t, err.Error(), "remove the other names")
}

// TestRefusedFile_HardLinkMadeWhileOpen: a name linked to a lock database
// while a container holds a lock through the first name is refused, and
// so is the first name for any later opener, since the file now has two;
// the holder keeps its lock.
func TestRefusedFile_HardLinkMadeWhileOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := filepath.Join(dir, "a.db")
	holder := MustOpen(t, locks.Config{Database: a, Owner: "A"})
	l, err := holder.Locks.Acquire(ctx, "A", stressResources[0], 0)
	require.NoError(t, err)
	b := filepath.Join(dir, "b.db")
	require.NoError(t, os.Link(a, b))
	for _, name := range []string{b, a} {
		_, err := locks.Open(ctx, locks.Config{Database: name, Owner: "B"})
		require.Error(t, err, name)
		checkHardLinked(t, err, 2)
	}
	assert.NoFileExists(t, b+"-wal", "the refused name gets no journal of its own")
	got, err := holder.Locks.Get(ctx, stressResources[0])
	require.NoError(t, err)
	assert.Equal(t, l.Token, got.Token)
}

// TestRefusedFile_RemovedWhileOpen: a name linked to an open lock database
// and the first name then removed (a rename, in two steps) leaves the
// file one name that a new opener accepts, with a journal of its own; and
// a name removed outright lets a new opener create a new, empty database
// by it. Either way the processes that had it open stop writing at their
// next write, rather than grant locks that those by the new name cannot
// see.
func TestRefusedFile_RemovedWhileOpen(t *testing.T) {
	ctx := context.Background()
	for name, replace := range map[string]func(t *testing.T, path string){
		"RenamedByALink": func(t *testing.T, path string) {
			require.NoError(t, os.Link(path, path+".new"))
			require.NoError(t, os.Remove(path))
		},
		"Removed": func(t *testing.T, path string) { require.NoError(t, os.Remove(path)) },
		"Replaced": func(t *testing.T, path string) {
			require.NoError(t, os.Remove(path))
			lockFile(t, path) // another process opens it by that name: a new database
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.db")
			holder := MustOpen(t, locks.Config{Database: path, Owner: "A"})
			_, err := holder.Locks.Acquire(ctx, "A", stressResources[0], 0)
			require.NoError(t, err)
			replace(t, path)
			_, err = holder.Locks.Acquire(ctx, "A", stressResources[1], 0)
			require.Error(t, err, "a write through a file that its name no longer names")
			require.ErrorIs(t, err, domain.ErrUnavailable)
			var re *sqlite.ReplacedFileError
			require.True(t, errors.As(err, &re), "a *sqlite.ReplacedFileError: %v", err)
			assert.Contains(t, err.Error(), "acquire lock on "+stressResources[1].String())
			assert.Contains(t, err.Error(), "open the store again")
		})
	}
}

// TestRefusedFile_PlantedLockSideFile: the side file "<db>-lock", by
// which the processes queue their writes, is the store's own. Something
// else planted at its name (a symbolic link, which Open would follow and
// create the target of; a FIFO, whose open would block for ever; a hard
// link to another file) is refused before the database is written, with
// what is wrong and what to do; the target is left as it was.
func TestRefusedFile_PlantedLockSideFile(t *testing.T) {
	for name, plant := range map[string]func(t *testing.T, side, victim string){
		"DanglingSymlink": func(t *testing.T, side, victim string) { require.NoError(t, os.Symlink(victim, side)) },
		"Symlink": func(t *testing.T, side, victim string) {
			require.NoError(t, os.WriteFile(victim, []byte("secret"), 0o600))
			require.NoError(t, os.Symlink(victim, side))
		},
		"FIFO": func(t *testing.T, side, victim string) { require.NoError(t, syscall.Mkfifo(side, 0o600)) },
		"HardLink": func(t *testing.T, side, victim string) {
			require.NoError(t, os.WriteFile(victim, []byte("secret"), 0o600))
			require.NoError(t, os.Link(victim, side))
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, "agents.db")
			lockFile(t, db)
			require.NoError(t, os.Remove(db+"-lock"))
			victim := filepath.Join(t.TempDir(), "victim")
			plant(t, db+"-lock", victim)
			before := filestate.Of(t, dir, db)
			_, victimErr := os.Lstat(victim)

			done := make(chan error, 1)
			go func() {
				c, err := locks.Open(context.Background(), locks.Config{Database: db, Owner: "op"})
				if err == nil {
					c.Close()
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				// Unblock the open of the FIFO so that the test can end.
				if f, ferr := os.OpenFile(db+"-lock", os.O_WRONLY|syscall.O_NONBLOCK, 0); ferr == nil {
					f.Close()
				}
				t.Fatal("Open blocked on the side file")
			}
			require.Error(t, err, "a planted side file is refused")
			require.ErrorIs(t, err, domain.ErrUnavailable)
			var se *sqlite.SideFileError
			require.True(t, errors.As(err, &se), "a *sqlite.SideFileError: %v", err)
			assert.Contains(t, err.Error(), db+"-lock")
			assert.Contains(t, err.Error(), "remove it")
			assert.Equal(t, before, filestate.Of(t, dir, db), "the database is left as it was")
			_, victimAfter := os.Lstat(victim)
			assert.Equal(t, victimErr == nil, victimAfter == nil, "nothing created through the link")
		})
	}
}

// TestRefusedFile_RelativePathAfterChdir: a store opened by a relative
// name keeps writing after the process changes its directory: SQLite
// resolved the name at open, and so does the check that the name still
// names the file.
func TestRefusedFile_RelativePathAfterChdir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Chdir(dir)
	c := MustOpen(t, locks.Config{Database: "agents.db", Owner: "A"})
	t.Chdir(t.TempDir())
	_, err := c.Locks.Acquire(ctx, "A", stressResources[0], 0)
	require.NoError(t, err)
	assert.NoFileExists(t, "agents.db")
}
