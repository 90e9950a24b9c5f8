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

// TestRefusedFile_ReadOnlyUnchanged: sqlite.OpenReadOnly, which the CLI's
// list and diagnostics use, reads a file that only a connection that may
// write could read (a -wal without its -shm, a hot journal) by refusing
// it, saying why, and leaving every file as it was.
func TestRefusedFile_ReadOnlyUnchanged(t *testing.T) {
	for name, tc := range map[string]struct {
		make  func(t testing.TB, path string)
		check func(t *testing.T, err error)
	}{
		"WALWithoutItsIndex": {func(t testing.TB, p string) {
			filestate.WALWithoutIndex(t, p, "CREATE TABLE locks (a, b); INSERT INTO locks VALUES (1, 2)")
		}, checkWALWithoutIndex},
		"HotJournal": {filestate.HotJournal, checkHotJournal},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "app.sqlite")
			tc.make(t, p)
			before := filestate.Of(t, dir, p)
			db, err := sqlite.OpenReadOnly(context.Background(), p, sqlite.Options{})
			if err == nil {
				db.Close()
			}
			require.Error(t, err)
			require.ErrorIs(t, err, domain.ErrUnavailable)
			tc.check(t, err)
			assert.Equal(t, before, filestate.Of(t, dir, p), "a refused file is left as it was: %v", err)
		})
	}
}

// TestRefusedFile_PlantedSQLiteSideFile: SQLite's own side files,
// "<db>-journal", "<db>-wal" and "<db>-shm", are opened by SQLite, which
// blocks for ever on a FIFO and follows a symbolic link. Something planted
// there is refused, by locks.Open and by sqlite.OpenReadOnly, before
// SQLite opens anything, with a *sqlite.SideFileError; the database (or,
// where there was none, its absence) and the planted file are left as
// they were.
func TestRefusedFile_PlantedSQLiteSideFile(t *testing.T) {
	plants := map[string]func(t *testing.T, side, victim string){
		"FIFO": func(t *testing.T, side, victim string) { require.NoError(t, syscall.Mkfifo(side, 0o600)) },
		"Symlink": func(t *testing.T, side, victim string) {
			require.NoError(t, os.WriteFile(victim, []byte("secret"), 0o600))
			require.NoError(t, os.Symlink(victim, side))
		},
		"DanglingSymlink": func(t *testing.T, side, victim string) { require.NoError(t, os.Symlink(victim, side)) },
		"Directory":       func(t *testing.T, side, victim string) { require.NoError(t, os.Mkdir(side, 0o700)) },
		"HardLink": func(t *testing.T, side, victim string) {
			require.NoError(t, os.WriteFile(victim, []byte("secret"), 0o600))
			require.NoError(t, os.Link(victim, side))
		},
	}
	opens := map[string]func(db string) error{
		"Open": func(db string) error {
			c, err := locks.Open(context.Background(), locks.Config{Database: db, Owner: "op"})
			if err == nil {
				c.Close()
			}
			return err
		},
		"OpenReadOnly": func(db string) error {
			d, err := sqlite.OpenReadOnly(context.Background(), db, sqlite.Options{})
			if err == nil {
				d.Close()
			}
			return err
		},
	}
	for _, side := range []string{"-journal", "-wal", "-shm"} {
		for kind, plant := range plants {
			for how, open := range opens {
				for _, exists := range []bool{true, false} {
					if !exists && how == "OpenReadOnly" {
						continue // it creates nothing anyway
					}
					name := side + "/" + kind + "/" + how
					if !exists {
						name += "/NewDatabase"
					}
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						dir := t.TempDir()
						db := filepath.Join(dir, "agents.db")
						if exists {
							lockFile(t, db)
						}
						victim := filepath.Join(t.TempDir(), "victim")
						plant(t, db+side, victim)
						var before filestate.State
						if exists {
							before = filestate.Of(t, dir, db)
						}
						entries, err := os.ReadDir(dir)
						require.NoError(t, err)
						_, victimErr := os.Lstat(victim)

						err = filestate.BlockedOnFIFO(t, db+side, "the open blocked on the side file", func() error { return open(db) })
						require.Error(t, err, "a planted side file is refused")
						require.ErrorIs(t, err, domain.ErrUnavailable)
						var se *sqlite.SideFileError
						require.True(t, errors.As(err, &se), "a *sqlite.SideFileError: %v", err)
						assert.Contains(t, err.Error(), db+side)
						assert.NotContains(t, err.Error(), "check the path")
						if exists {
							assert.Equal(t, before, filestate.Of(t, dir, db), "the database is left as it was")
						} else {
							assert.NoFileExists(t, db, "no database is created beside a refused side file")
						}
						after, err := os.ReadDir(dir)
						require.NoError(t, err)
						assert.Equal(t, len(entries), len(after), "no file is added: %v", after)
						_, victimAfter := os.Lstat(victim)
						assert.Equal(t, victimErr == nil, victimAfter == nil, "nothing created through the link")
					})
				}
			}
		}
	}
}

// TestRefusedFile_LiveStoreOpens: the checks that refuse a foreign file
// read the store's own live file (another container of this process has
// it open, with its -wal and -shm, and commits not yet copied into the
// file) without harm: a second container opens it and sees the first's
// lock, and so does sqlite.OpenReadOnly; the first keeps working.
func TestRefusedFile_LiveStoreOpens(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	a := MustOpen(t, locks.Config{Database: db, Owner: "A"})
	l, err := a.Locks.Acquire(ctx, "A", stressResources[0], 0)
	require.NoError(t, err)
	require.FileExists(t, db+"-wal")
	require.FileExists(t, db+"-shm")

	b := MustOpen(t, locks.Config{Database: db, Owner: "B"})
	got, err := b.Locks.Get(ctx, stressResources[0])
	require.NoError(t, err)
	assert.Equal(t, l.Token, got.Token)

	ro, err := sqlite.OpenReadOnly(ctx, db, sqlite.Options{})
	require.NoError(t, err)
	st, err := ro.Schema(ctx)
	require.NoError(t, err)
	assert.True(t, st.MigrationApplied)
	require.NoError(t, ro.Close())

	_, err = a.Locks.Acquire(ctx, "A", stressResources[1], 0)
	require.NoError(t, err, "the first container keeps writing")
	_, err = b.Locks.Acquire(ctx, "B", stressResources[1], 0)
	require.ErrorIs(t, err, domain.ErrConflict)
}

// TestRefusedFile_OwnStoreOpens: the read-only preflight accepts the
// store's own files in each state they are found in: an empty file, a
// store closed cleanly (no -wal), and one left by processes that were
// killed (its -wal, with commits not yet copied into the file, and its
// -shm, with no process to share them): the lock held in it is seen.
func TestRefusedFile_OwnStoreOpens(t *testing.T) {
	ctx := context.Background()
	t.Run("Empty", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "agents.db")
		require.NoError(t, os.WriteFile(db, nil, 0o600))
		c := MustOpen(t, locks.Config{Database: db, Owner: "A"})
		_, err := c.Locks.Acquire(ctx, "A", stressResources[0], 0)
		require.NoError(t, err)
	})
	t.Run("Closed", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "agents.db")
		lockFile(t, db)
		require.NoFileExists(t, db+"-wal")
		c := MustOpen(t, locks.Config{Database: db, Owner: "A"})
		_, err := c.Locks.Acquire(ctx, "A", stressResources[0], 0)
		require.ErrorIs(t, err, domain.ErrConflict, "ghost's lock is there")
	})
	t.Run("JournalOfAWriterStillAtWork", func(t *testing.T) {
		// Another process's transaction (the switch to WAL of a store it
		// is creating) has a -journal file until it commits: one that
		// goes away while Open looks is no hot journal, and Open waits
		// for it rather than refuse the file.
		db := filepath.Join(t.TempDir(), "agents.db")
		lockFile(t, db)
		require.NoError(t, os.WriteFile(db+"-journal", make([]byte, 512), 0o600))
		gone := make(chan error, 1)
		go func() {
			time.Sleep(300 * time.Millisecond)
			gone <- os.Remove(db + "-journal")
		}()
		c, err := locks.Open(ctx, locks.Config{Database: db, Owner: "A"})
		require.NoError(t, <-gone)
		require.NoError(t, err, "a journal that its writer removes is waited for")
		require.NoError(t, c.Close())
	})
	t.Run("EmptyWALWithoutItsIndex", func(t *testing.T) {
		// A read-only connection opens the -wal file with O_CREAT: one
		// that looked while the last process closed the store (removing
		// -wal and -shm) leaves an empty -wal behind. It holds no commit:
		// every process must still open the store, writing or reading.
		db := filepath.Join(t.TempDir(), "agents.db")
		lockFile(t, db)
		require.NoError(t, os.WriteFile(db+"-wal", nil, 0o600))
		r, err := sqlite.OpenReadOnly(ctx, db, sqlite.Options{})
		require.NoError(t, err, "an empty -wal without its -shm holds nothing to refuse")
		require.NoError(t, r.Close())
		c, err := locks.Open(ctx, locks.Config{Database: db, Owner: "A"})
		require.NoError(t, err, "an empty -wal without its -shm holds nothing to refuse")
		_, err = c.Locks.Acquire(ctx, "A", stressResources[0], 0)
		require.ErrorIs(t, err, domain.ErrConflict, "ghost's lock is there")
		require.NoError(t, c.Close())
	})
	t.Run("LeftByKilledProcesses", func(t *testing.T) {
		// A copy of a live store's three files is what processes killed
		// at that moment leave.
		src := filepath.Join(t.TempDir(), "live.db")
		live := MustOpen(t, locks.Config{Database: src, Owner: "ghost"})
		l, err := live.Locks.Acquire(ctx, "ghost", stressResources[0], 0)
		require.NoError(t, err)
		dir := t.TempDir()
		db := filepath.Join(dir, "agents.db")
		for _, suffix := range []string{"", "-wal", "-shm"} {
			b, err := os.ReadFile(src + suffix)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(db+suffix, b, 0o600))
		}
		c := MustOpen(t, locks.Config{Database: db, Owner: "A"})
		got, err := c.Locks.Get(ctx, stressResources[0])
		require.NoError(t, err)
		assert.Equal(t, l.Token, got.Token)
	})
}
