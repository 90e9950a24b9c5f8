package sqlite_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Some cases need another process: a writer that is not this process's
// connections, or a user who is not root (root ignores permission bits, and
// the tests run as root in CI). The test binary re-executes itself with
// workerEnv set; see TestMain.

const (
	workerEnv = "LOCKS_SQLITE_TEST_WORKER"
	dbEnv     = "LOCKS_SQLITE_TEST_DB"
	countEnv  = "LOCKS_SQLITE_TEST_COUNT"
	// nobody is the unprivileged user the workers run as under root.
	nobody = 65534
)

func TestMain(m *testing.M) {
	var code int
	switch os.Getenv(workerEnv) {
	case "":
		code = m.Run()
		if binDir != "" {
			os.RemoveAll(binDir)
		}
		if code == 0 {
			// Every test has ended: nothing of the store may run on.
			if err := goleak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "goroutines left running after the tests:", err)
				code = 1
			}
		}
	case "inspect":
		code = workerInspect(os.Getenv(dbEnv))
	case "check-writable":
		code = report(errorReport(sqlite.CheckWritable(os.Getenv(dbEnv))))
	case "write":
		code = workerWrite(os.Getenv(dbEnv))
	case "open-owner":
		code = workerOpenOwner(os.Getenv(dbEnv))
	case "mount-after-open":
		code = workerMountAfterOpen(os.Getenv(dbEnv))
	default:
		fmt.Fprintln(os.Stderr, "unknown worker", os.Getenv(workerEnv))
		code = 2
	}
	os.Exit(code)
}

// ownerEnv is the owner id the open-owner worker opens with.
const ownerEnv = "LOCKS_SQLITE_TEST_OWNER"

// workerOpenOwner opens the database with the owner id ownerEnv and
// reports the error, naming a *sqlite.MountedFileError in As.
func workerOpenOwner(path string) int {
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{Owner: os.Getenv(ownerEnv)})
	if err == nil {
		return report(errorReport(db.Close()))
	}
	r := errorReport(err)
	if mf := (*sqlite.MountedFileError)(nil); errors.As(err, &mf) {
		r.As = "MountedFileError"
	}
	return report(r)
}

// mountEnv is what the mount-after-open worker mounts: "FILE SIDE".
const mountEnv = "LOCKS_SQLITE_TEST_MOUNT"

// workerMountAfterOpen opens the database, then (in its own mount
// namespace: the caller's) bind-mounts FILE onto SIDE, a side file, and
// reads through a new connection; it reports the read's error, naming a
// *sqlite.MountedFileError in As.
func workerMountAfterOpen(path string) int {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		return report(errorReport(err))
	}
	defer db.Close()
	file, side, _ := strings.Cut(os.Getenv(mountEnv), " ")
	if out, err := exec.Command("mount", "--bind", file, side).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "mount: %v: %s\n", err, out)
		return 1
	}
	readers := db.Readers()
	readers.SetMaxIdleConns(0) // the next read opens a new connection
	var n int
	err = readers.QueryRowContext(ctx, "SELECT count(*) FROM locks").Scan(&n)
	r := errorReport(err)
	if mf := (*sqlite.MountedFileError)(nil); errors.As(err, &mf) {
		r.As = "MountedFileError"
	}
	return report(r)
}

// workerReport is what a worker prints on stdout.
type workerReport struct {
	Owner string `json:"owner"` // of the lock on plan p1, read through the store
	Kind  string `json:"kind"`  // of a *domain.StoreError, or "validation"
	Error string `json:"error"`
	As    string `json:"as,omitempty"` // the typed error the worker looked for, when it found it
}

func errorReport(err error) workerReport {
	var r workerReport
	if err == nil {
		return r
	}
	r.Error = err.Error()
	var se *domain.StoreError
	switch {
	case errors.As(err, &se):
		r.Kind = se.Kind.String()
	case errors.Is(err, domain.ErrValidation):
		r.Kind = "validation"
	}
	return r
}

func report(r workerReport) int {
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

// workerInspect opens the database read-only and reads the lock on plan p1.
func workerInspect(path string) int {
	ctx := context.Background()
	db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
	if err != nil {
		return report(errorReport(err))
	}
	defer db.Close()
	l, err := sqlite.NewLockRepository(db).Get(ctx, domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"})
	r := errorReport(err)
	r.Owner = l.Owner
	return report(r)
}

// workerWrite opens the database as the service does, acquires countEnv
// locks on plans w0, w1, ..., one commit each, prints "committed", and
// closes the database when its stdin closes.
func workerWrite(path string) int {
	ctx := context.Background()
	n, err := strconv.Atoi(os.Getenv(countEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	svc, err := application.NewLockService(sqlite.NewLockRepository(db), clock.New(), 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := range n {
		if _, err := svc.Acquire(ctx, "writer", domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("w%d", i)}, 0); err != nil {
			fmt.Fprintln(os.Stderr, "acquire:", err)
			return 1
		}
	}
	fmt.Println("committed")
	io.Copy(io.Discard, os.Stdin)
	if err := db.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		return 1
	}
	return 0
}

// worker returns the command that runs this test binary as the named
// worker on the database at db, as user nobody when asNobody. Only root
// can start a process as another user: the caller skips otherwise.
func worker(t *testing.T, name, db string, asNobody bool, env ...string) *exec.Cmd {
	t.Helper()
	bin := os.Args[0]
	if asNobody {
		require.Zero(t, os.Geteuid(), "only root can run a worker as another user")
		bin = nobodyBinary(t)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{workerEnv + "=" + name, dbEnv + "=" + db}, env...)...)
	cmd.Stderr = os.Stderr
	if asNobody {
		cmd.Dir = filepath.Dir(bin)
		runAs(t, cmd, nobody)
	}
	return cmd
}

// runWorker runs a worker to its end and returns its report.
func runWorker(t *testing.T, name, db string, asNobody bool) workerReport {
	t.Helper()
	out, err := worker(t, name, db, asNobody).Output()
	require.NoError(t, err)
	var r workerReport
	require.NoError(t, json.Unmarshal(out, &r), "%s", out)
	return r
}

// startWriter starts a writer process that acquires n locks; it returns
// once they are committed, with the function that makes the writer close
// the database and waits for it to exit.
func startWriter(t *testing.T, db string, n int) (stop func()) {
	t.Helper()
	cmd := worker(t, "write", db, false, countEnv+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var once sync.Once
	stop = func() {
		once.Do(func() {
			stdin.Close()
			require.NoError(t, cmd.Wait())
		})
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the writer failed: see its output above")
	require.Equal(t, "committed\n", line)
	return stop
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// nobodyBinary returns a copy of the test binary that user nobody can run
// (the original may sit in a directory only root can enter).
func nobodyBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "sqlite-test-bin-"); binErr != nil {
			return
		}
		if binErr = os.Chmod(binDir, 0o755); binErr != nil {
			return
		}
		binErr = copyFile(os.Args[0], filepath.Join(binDir, "sqlite.test"), 0o755)
	})
	require.NoError(t, binErr)
	return filepath.Join(binDir, "sqlite.test")
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// reachableDir returns a new directory that user nobody can enter and
// read, with the given mode (t.TempDir and its parent are private).
func reachableDir(t *testing.T, mode os.FileMode) string {
	t.Helper()
	parent := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(parent), 0o755))
	require.NoError(t, os.Chmod(parent, 0o755))
	dir := filepath.Join(parent, "db")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, mode))
	// RemoveAll needs to write in it.
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	return dir
}
