//go:build unix

package cli

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startHolder holds the write lock of db in another process until the test
// ends.
func startHolder(t *testing.T, db string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHoldWriteLock+"="+db)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "holding\n", line)
}

// unprivilegedAgents returns the agents binary and the user to run it as
// for a test that needs an unprivileged user: nobody when the tests run
// as root, who reads and writes any file whatever its mode; otherwise the
// test's own user.
func unprivilegedAgents(t *testing.T) (string, *syscall.Credential) {
	if os.Geteuid() != 0 {
		return agentsBin, nil
	}
	// The build directory is private to root: nobody needs a copy it can
	// reach.
	bin := filepath.Join(reachableDir(t), "agents")
	b, err := os.ReadFile(agentsBin)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	require.NoError(t, os.Chmod(bin, 0o755))
	return bin, &syscall.Credential{Uid: 65534, Gid: 65534}
}

// reachableDir is a temporary directory that other users can enter and
// read, but not write.
func reachableDir(t *testing.T) string {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

// timedRun runs agents as cred (nil: as the test's user) and says how long
// it took.
func timedRun(t *testing.T, bin string, cred *syscall.Credential, args ...string) (result, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"HOME=/nonexistent", "TZ=UTC", "PATH=" + os.Getenv("PATH")}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}, took
}

// TestCLI_WritesOnlyWhereAsked runs every command against databases it
// must not damage: a missing path, another application's SQLite file, a
// read-only lock database as a user who cannot write it, and a lock
// database whose write lock another process holds. Only acquire and run
// create a database, and only with --create; list and diagnostics read, at once, whatever a
// writer does; and no file changes or appears.
func TestCLI_WritesOnlyWhereAsked(t *testing.T) {
	t.Parallel()
	type command struct {
		name     string
		args     []string
		readOnly bool // list and diagnostics: never wait, never write
		creates  bool // acquire and run: may create a missing database
	}
	commands := []command{
		{name: "acquire", args: []string{"--owner", "op", "locks", "acquire", "plan", "p1"}, creates: true},
		{name: "run", args: []string{"--owner", "op", "locks", "run", "plan", "p1", "--", "true"}, creates: true},
		{name: "renew", args: []string{"--owner", "ghost", "locks", "renew", "plan", "held"}},
		{name: "release", args: []string{"--owner", "ghost", "locks", "release", "plan", "held"}},
		{name: "release-all", args: []string{"--owner", "ghost", "locks", "release-all"}},
		{name: "cleanup", args: []string{"locks", "cleanup"}},
		{name: "list", args: []string{"locks", "list"}, readOnly: true},
		{name: "list-all", args: []string{"locks", "list", "--all"}, readOnly: true},
		{name: "diagnostics", args: []string{"diagnostics"}, readOnly: true},
	}
	nobodyBin, nobody := unprivilegedAgents(t)

	// seedLockDB makes a lock database in dir, closed, with an active lock
	// of owner ghost on plan/held.
	seedLockDB := func(t *testing.T, dir string) string {
		db := filepath.Join(dir, "agents.db")
		c := newAgents(t)
		r := c.runEnv(nil, "--db", db, "--owner", "ghost", "locks", "acquire", "plan", "held", "--ttl", "1h")
		require.Equal(t, 0, r.code, r.stderr)
		return db
	}

	for _, cmd := range commands {
		t.Run(cmd.name, func(t *testing.T) {
			t.Parallel()
			t.Run("MissingPath", func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				db := filepath.Join(dir, "agents.db")
				r, _ := timedRun(t, agentsBin, nil, append([]string{"--db", db}, cmd.args...)...)
				assert.Equal(t, 1, r.code, r.stderr)
				assert.NoFileExists(t, db, "no command creates a database that --db names unless asked")
				assert.Empty(t, snapshot(t, dir))
				switch {
				case cmd.creates:
					assert.Contains(t, r.stderr, "there is no lock database at "+db)
					assert.Contains(t, r.stderr, "pass --create")
					// --create comes after the command's name: it is acquire's and run's own.
					create := slices.Insert(slices.Clone(cmd.args), 4, "--create")
					r, _ = timedRun(t, agentsBin, nil, append([]string{"--db", db}, create...)...)
					assert.Equal(t, 0, r.code, r.stderr)
					assert.FileExists(t, db)
				case cmd.name != "diagnostics":
					assert.Contains(t, r.stderr, "there is no lock database at "+db)
					assert.Contains(t, r.stderr, "check --db")
				}
			})
			t.Run("ForeignFile", func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				db := filepath.Join(dir, "notes.sqlite")
				sdb, err := sql.Open("sqlite", db)
				require.NoError(t, err)
				_, err = sdb.Exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('keep me')")
				require.NoError(t, err)
				require.NoError(t, sdb.Close())
				before := snapshot(t, dir)

				r, _ := timedRun(t, agentsBin, nil, append([]string{"--db", db}, cmd.args...)...)
				assert.Equal(t, 1, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
				assert.Equal(t, before, snapshot(t, dir), "another application's file is left as it was")
				if cmd.name != "diagnostics" {
					assert.Contains(t, r.stderr, db)
					assert.Contains(t, r.stderr, "check --db")
				}
			})
			t.Run("ReadOnlyFileUnprivileged", func(t *testing.T) {
				t.Parallel()
				dir := reachableDir(t)
				db := seedLockDB(t, dir)
				require.NoError(t, os.Chmod(db, 0o444))
				before := snapshot(t, dir)

				r, _ := timedRun(t, nobodyBin, nobody, append([]string{"--db", readerDB(cmd.readOnly, db)}, cmd.args...)...)
				assert.Equal(t, before, snapshot(t, dir), "stdout: %s\nstderr: %s", r.stdout, r.stderr)
				switch {
				case cmd.name == "diagnostics":
					assert.Equal(t, 1, r.code, "the database check fails: nobody can write it")
					assert.Regexp(t, `(?m)^  ok +schema `, r.stdout)
					assert.Regexp(t, `(?m)^  ok +active_locks +1 lock held`, r.stdout)
				case cmd.readOnly:
					assert.Equal(t, 0, r.code, r.stderr)
					assert.Regexp(t, `(?m)^plan +held +ghost `, r.stdout)
				default:
					assert.Equal(t, 1, r.code, r.stderr)
					assert.Contains(t, r.stderr, "read-only")
				}
			})
		})
	}

	// The writers wait out their busy timeouts behind the holder: run them
	// all at once, against the one database, rather than one at a time.
	t.Run("WriteLockHeld", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		db := seedLockDB(t, dir)
		startHolder(t, db)
		// Readers of a WAL database write their read marks in the -shm
		// file, shared memory by design: it must exist before and after,
		// but its bytes are not the database's.
		before := withoutSHM(snapshot(t, dir))
		outcomes := make([]result, len(commands))
		var wg sync.WaitGroup
		for i, cmd := range commands {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outcomes[i], _ = timedRun(t, agentsBin, nil, append([]string{"--db", readerDB(cmd.readOnly, db)}, cmd.args...)...)
			}()
		}
		wg.Wait()
		assert.Equal(t, before, withoutSHM(snapshot(t, dir)))
		for i, cmd := range commands {
			t.Run(cmd.name, func(t *testing.T) {
				r := outcomes[i]
				if cmd.readOnly {
					assert.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
					assert.Contains(t, r.stdout, "held")
					return
				}
				assert.Equal(t, 1, r.code, r.stderr)
				assert.Contains(t, r.stderr, "busy")
			})
		}
	})
}

// readerDB names db for a command: for a reader (list, diagnostics), with
// a busy timeout of an hour, so that a reader that waits for another
// process's lock hangs, until timedRun's guard kills it and its exit code
// tells, however slow the machine; not how long it took.
func readerDB(reader bool, db string) string {
	if !reader {
		return db
	}
	return "file:" + db + "?_busy_timeout=3600000"
}

// withoutSHM replaces the digest of every -shm file by zeros.
func withoutSHM(files map[string][32]byte) map[string][32]byte {
	out := make(map[string][32]byte, len(files))
	for name, sum := range files {
		if strings.HasSuffix(name, "-shm") {
			sum = [32]byte{}
		}
		out[name] = sum
	}
	return out
}
