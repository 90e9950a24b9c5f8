//go:build linux

package cli

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_PlantedSideFile: a FIFO or a symbolic link that another user put
// at the database's "-wake" or "-lock" side file makes acquire and run
// fail at once, saying which file to remove, instead of hanging on the
// FIFO or writing through the link; the planted file stays.
func TestCLI_PlantedSideFile(t *testing.T) {
	t.Parallel()
	for _, side := range []string{"-wake", "-lock"} {
		for _, kind := range []string{"FIFO", "Symlink"} {
			t.Run(kind+side, func(t *testing.T) {
				t.Parallel()
				a := newAgents(t)
				victim := filepath.Join(t.TempDir(), "victim")
				require.NoError(t, os.WriteFile(victim, []byte("not for the lock store\n"), 0o600))
				switch kind {
				case "FIFO":
					require.NoError(t, syscall.Mkfifo(a.db+side, 0o644))
				case "Symlink":
					require.NoError(t, os.Symlink(victim, a.db+side))
				}
				for _, args := range [][]string{
					{"--owner", "me", "locks", "acquire", "plan", "p1"},
					{"--owner", "me", "locks", "run", "plan", "p1", "--", "true"},
				} {
					start := time.Now()
					r := a.run(args...)
					assert.Less(t, time.Since(start), 20*time.Second, "%v", args)
					assert.Equal(t, 1, r.code, "%v\nstdout: %s\nstderr: %s", args, r.stdout, r.stderr)
					assert.Contains(t, r.stderr, a.db+side, "%v", args)
					assert.Contains(t, r.stderr, "remove it", "%v", args)
				}
				fi, err := os.Lstat(a.db + side)
				require.NoError(t, err, "the planted file was removed")
				assert.NotZero(t, fi.Mode()&(fs.ModeNamedPipe|fs.ModeSymlink), "the planted file was replaced")
				b, err := os.ReadFile(victim)
				require.NoError(t, err)
				assert.Equal(t, "not for the lock store\n", string(b))
			})
		}
	}
}

// TestCLI_PlantedFIFOAsAnotherUser: a user who may write the database but
// not a FIFO planted at "-wake" (the case that fell back to a blocking
// read-only open, which hung forever) is refused at once too.
func TestCLI_PlantedFIFOAsAnotherUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run agents as another user than the FIFO's owner")
	}
	bin, nobody := unprivilegedAgents(t)
	dir := reachableDir(t)
	require.NoError(t, os.Chmod(dir, 0o777))
	a := newAgents(t)
	a.db = filepath.Join(dir, "agents.db")
	a.mustRun("--owner", "ghost", "locks", "acquire", "plan", "held", "--ttl", "1h")
	for _, name := range []string{a.db, a.db + "-lock"} {
		require.NoError(t, os.Chmod(name, 0o666))
	}
	require.NoError(t, os.Remove(a.db+"-wake"))
	require.NoError(t, syscall.Mkfifo(a.db+"-wake", 0o644))

	r, took := timedRun(t, bin, nobody, "--db", a.db, "--owner", "nobody", "locks", "acquire", "plan", "p2")
	assert.Less(t, took, 20*time.Second)
	assert.Equal(t, 1, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	assert.Contains(t, r.stderr, a.db+"-wake")
	assert.Contains(t, r.stderr, "remove it")
}

// TestCLI_PlantedSQLiteSideFile: a FIFO, a symbolic link or a directory
// planted at one of SQLite's own side files ("-journal", "-wal", "-shm")
// makes every command fail at once, saying which file it is and what to
// do, instead of hanging on the FIFO (SQLite opens the journal to read
// it) or following the link; the planted file, and the database, stay as
// they were. Where the database does not exist yet, acquire --create
// creates none beside it.
func TestCLI_PlantedSQLiteSideFile(t *testing.T) {
	t.Parallel()
	for _, side := range []string{"-journal", "-wal", "-shm"} {
		for _, kind := range []string{"FIFO", "Symlink", "Directory"} {
			for _, exists := range []bool{true, false} {
				name := kind + side
				if !exists {
					name += "/NewDatabase"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					a := newAgents(t)
					if exists {
						a.mustRun("--owner", "ghost", "locks", "acquire", "plan", "held", "--ttl", "1h")
					}
					victim := filepath.Join(t.TempDir(), "victim")
					require.NoError(t, os.WriteFile(victim, []byte("not for the lock store\n"), 0o600))
					switch kind {
					case "FIFO":
						require.NoError(t, syscall.Mkfifo(a.db+side, 0o644))
					case "Symlink":
						require.NoError(t, os.Symlink(victim, a.db+side))
					case "Directory":
						require.NoError(t, os.Mkdir(a.db+side, 0o700))
					}
					commands := [][]string{
						{"--owner", "me", "locks", "acquire", "--create", "plan", "p1"},
					}
					if exists {
						commands = append(commands,
							[]string{"--owner", "me", "locks", "run", "plan", "p1", "--", "true"},
							[]string{"--owner", "ghost", "locks", "release", "plan", "held"},
							[]string{"locks", "list", "--all"},
							[]string{"diagnostics"},
						)
					}
					for _, args := range commands {
						start := time.Now()
						r := a.run(args...)
						assert.Less(t, time.Since(start), 20*time.Second, "%v", args)
						assert.Equal(t, 1, r.code, "%v\nstdout: %s\nstderr: %s", args, r.stdout, r.stderr)
						out := r.stderr + r.stdout // diagnostics reports on stdout
						assert.Contains(t, out, a.db+side, "%v", args)
						assert.Contains(t, out, "it must be a regular file of the lock store's own", "%v", args)
						assert.NotContains(t, out, "check the path", "%v", args)
					}
					fi, err := os.Lstat(a.db + side)
					require.NoError(t, err, "the planted file was removed")
					assert.NotZero(t, fi.Mode()&(fs.ModeNamedPipe|fs.ModeSymlink|fs.ModeDir), "the planted file was replaced")
					if !exists {
						assert.NoFileExists(t, a.db, "no database is created beside a refused side file")
					}
					b, err := os.ReadFile(victim)
					require.NoError(t, err)
					assert.Equal(t, "not for the lock store\n", string(b))
				})
			}
		}
	}
}
