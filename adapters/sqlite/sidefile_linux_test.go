//go:build linux

package sqlite_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/filestate"
)

// victim is a file of this user's that a planted side file points at: a
// test checks that nothing wrote to it or changed its mode.
type victim struct {
	path string
	sum  [32]byte
	mode fs.FileMode
}

func newVictim(t *testing.T) *victim {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(path, []byte("this user's private file, 78 bytes long, which no release may write to.....\n"), 0o600))
	return (&victim{path: path}).read(t)
}

func (v *victim) read(t *testing.T) *victim {
	t.Helper()
	b, err := os.ReadFile(v.path)
	require.NoError(t, err)
	fi, err := os.Stat(v.path)
	require.NoError(t, err)
	return &victim{path: v.path, sum: sha256.Sum256(b), mode: fi.Mode()}
}

func (v *victim) requireUnchanged(t *testing.T) {
	t.Helper()
	now := v.read(t)
	assert.Equal(t, v.sum, now.sum, "the planted side file's target was written")
	assert.Equal(t, v.mode, now.mode, "the planted side file's target was chmod'ed")
}

// plant puts something other than a side file of ours at name, as
// another local user could in a directory both may write, and returns
// what a later look at name must still find.
type plant struct {
	name string
	make func(name string, v *victim) error
}

var plants = []plant{
	{"SymlinkToVictim", func(name string, v *victim) error { return os.Symlink(v.path, name) }},
	{"DanglingSymlink", func(name string, v *victim) error { return os.Symlink(v.path+"-new", name) }},
	{"FIFO", func(name string, _ *victim) error { return syscall.Mkfifo(name, 0o666) }},
	{"Directory", func(name string, _ *victim) error { return os.Mkdir(name, 0o700) }},
	{"HardLinkToVictim", func(name string, v *victim) error { return os.Link(v.path, name) }},
}

// replaceWith removes the file at name and plants p there, again if a
// watching store re-created the file in between, as it does at once.
func (p plant) replaceWith(t *testing.T, name string, v *victim) {
	t.Helper()
	var err error
	for range 1000 {
		if err = os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err = p.make(name, v); err == nil {
			return
		}
	}
	require.NoError(t, err)
}

// openWithin opens the store at path, failing the test instead of hanging
// when Open does not return within a generous bound (a blocking open of a
// FIFO never returns).
func openWithin(t *testing.T, path string) (*sqlite.DB, error) {
	t.Helper()
	type opened struct {
		db  *sqlite.DB
		err error
	}
	c := make(chan opened, 1)
	go func() {
		db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
		c <- opened{db, err}
	}()
	select {
	case o := <-c:
		if o.db != nil {
			t.Cleanup(func() { o.db.Close() })
		}
		return o.db, o.err
	case <-time.After(30 * time.Second):
		t.Fatal("Open did not return within 30 s")
		return nil, nil
	}
}

// requireRefused checks that err refuses the side file at name, says what
// is wrong and what to do, and matches the store's errors.
func requireRefused(t *testing.T, err error, name string) {
	t.Helper()
	require.Error(t, err, "a planted %s was accepted", name)
	var sfe *sqlite.SideFileError
	require.ErrorAs(t, err, &sfe)
	assert.Equal(t, name, sfe.Path)
	assert.ErrorIs(t, err, domain.ErrUnavailable)
	assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable), "%v", err)
	assert.Contains(t, err.Error(), name)
	assert.Contains(t, err.Error(), "remove it")
}

// TestOpen_PlantedSideFile: a symlink, FIFO, directory or hard link that
// another user planted at "<db>-wake" or "<db>-lock" is refused, promptly,
// with an error that names it, and neither it nor what it points at
// changes. Nothing is created for a new database either.
func TestOpen_PlantedSideFile(t *testing.T) {
	for _, side := range []string{"-wake", "-lock"} {
		for _, p := range plants {
			for _, existing := range []bool{false, true} {
				name := p.name + side
				if existing {
					name += "/ExistingDatabase"
				}
				t.Run(name, func(t *testing.T) {
					dir := t.TempDir()
					path := filepath.Join(dir, "agents.db")
					if existing {
						db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
						require.NoError(t, err)
						require.NoError(t, db.Close())
						require.NoError(t, os.Remove(path+side))
					}
					v := newVictim(t)
					require.NoError(t, p.make(path+side, v))
					before, err := os.Lstat(path + side)
					require.NoError(t, err)

					_, err = openWithin(t, path)
					requireRefused(t, err, path+side)
					v.requireUnchanged(t)
					after, err := os.Lstat(path + side)
					require.NoError(t, err, "the planted file was removed")
					assert.Equal(t, before.Mode(), after.Mode(), "the planted file changed")
					if !existing {
						assert.NoFileExists(t, path, "a database was created beside a planted side file")
					}
				})
			}
		}
	}
}

// TestWakeups_PlantedAfterOpen: a wake file replaced by a symlink while
// the store is open (another user removed ours and planted it) is never
// written through by later releases, nor chmod'ed; and a FIFO planted
// there does not block a release.
func TestWakeups_PlantedAfterOpen(t *testing.T) {
	for _, p := range plants {
		t.Run(p.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agents.db")
			releaser := openWake(t, path)
			waiter := openWake(t, path)
			_, stop := waiter.Wakeups().Watch(wakeRef)
			defer stop()
			v := newVictim(t)
			p.replaceWith(t, path+"-wake", v)

			done := make(chan struct{})
			go func() {
				defer close(done)
				for range 10 {
					sqlite.Freed(releaser, wakeRef)
					releaser.Wakeups().Contended(wakeRef)
					c, stop := waiter.Wakeups().Watch(wakeRef)
					if c != nil {
						stop()
					}
				}
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("releases and watches blocked on the planted wake file")
			}
			v.requireUnchanged(t)
		})
	}
}

// TestOpen_ForeignSideFile: a side file that belongs to another user,
// who is neither the database's owner nor root, is refused: that user
// could hold the writers' lock forever or fake this process's marks.
func TestOpen_ForeignSideFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to make a file of another user")
	}
	for _, side := range []string{"-wake", "-lock"} {
		t.Run(side, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agents.db")
			require.NoError(t, os.WriteFile(path+side, nil, 0o644))
			require.NoError(t, os.Chown(path+side, 54321, 54321))
			_, err := openWithin(t, path)
			requireRefused(t, err, path+side)
			assert.Contains(t, err.Error(), "belongs to uid 54321")
		})
	}
}

// TestOpen_SideFileOfTheWritingGroup: a side file that a member of the
// database's group made, where that group may write the database, is the
// shared database's own and is used.
func TestOpen_SideFileOfTheWritingGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to make a file of another user")
	}
	path := filepath.Join(t.TempDir(), "agents.db")
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.NoError(t, os.Chown(path, 0, 54321))
	require.NoError(t, os.Chmod(path, 0o660))
	for _, side := range []string{"-wake", "-lock"} {
		require.NoError(t, os.Chown(path+side, 54322, 54321))
	}
	db, err = openWithin(t, path)
	require.NoError(t, err)
	require.NotNil(t, db.Wakeups())

	require.NoError(t, os.Chmod(path, 0o640)) // the group may no longer write it
	_, err = openWithin(t, path)
	requireRefused(t, err, path+"-lock")
}

// TestSideFile_FIFOJournalPlantedAfterOpen: SQLite opens "<db>-journal",
// whenever one exists, on each new connection (to see whether it is a
// hot journal), and would block for ever on a FIFO planted there after
// the store opened. The pool checks the side files before it opens a
// connection: the read fails at once with a *sqlite.SideFileError.
func TestSideFile_FIFOJournalPlantedAfterOpen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer db.Close()
	fifo := path + "-journal"
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	defer os.Remove(fifo)
	readers := db.Readers()
	readers.SetMaxIdleConns(0) // the next read opens a new connection

	err = filestate.BlockedOnFIFO(t, fifo, "a new connection blocked on the FIFO", func() error {
		var n int
		return readers.QueryRowContext(ctx, "SELECT count(*) FROM locks").Scan(&n)
	})
	require.Error(t, err)
	var se *sqlite.SideFileError
	require.True(t, errors.As(err, &se), "a *sqlite.SideFileError: %v", err)
	assert.Equal(t, fifo, se.Path)
}
