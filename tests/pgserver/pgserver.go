//go:build unix

// Package pgserver starts a private PostgreSQL server for one test: initdb
// in a directory of its own, a free port on 127.0.0.1 and a unix socket
// beside the data. Tests that stop, restart or kill a server use it, so
// that they never disturb the other tests of `go test ./...`, which share
// the machine's server and run in parallel packages.
//
// The server only starts when the machine's PostgreSQL tests are enabled
// (testdb.EnvPostgres is set, as .ci/run does) and PostgreSQL's server
// binaries are installed; otherwise the test skips, saying why.
package pgserver

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/cleveragents/locks/tests/testdb"
)

// Timeouts of the server's own commands: generous, for a loaded CI
// machine, but bounded, so that a server that never comes up fails the
// test instead of hanging it.
const (
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
)

// Server is a running private PostgreSQL server.
type Server struct {
	tb      testing.TB
	bin     string // the directory of initdb, pg_ctl and pg_isready
	dir     string // owned by the server's user: data/, the socket, the log
	port    int
	cred    *syscall.Credential // the unprivileged user to run as, when root
	options string              // the server's command line options
}

// Start initialises and starts a server, stopped and removed when the
// test ends. Its superuser is "postgres", with trust authentication.
// extra are further server settings, e.g. "log_statement=ddl".
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	if !testdb.PostgresAvailable() {
		tb.Skipf("PostgreSQL fault tests skipped: set %s to run the PostgreSQL tests (they start a private server too)",
			testdb.EnvPostgres)
	}
	bin := binDir()
	if bin == "" {
		tb.Skip("PostgreSQL fault tests skipped: the server's binaries (initdb, pg_ctl) were not found; " +
			"install the PostgreSQL server or put pg_config on the PATH")
	}
	s := &Server{tb: tb, bin: bin}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		cred, err := credential("postgres")
		if err != nil {
			tb.Skipf("PostgreSQL fault tests skipped: running as root, and no unprivileged user to run the server as: %v", err)
		}
		s.cred = cred
	}
	dir, err := os.MkdirTemp("", "locks-pg-") // short: a socket path has at most 107 bytes
	if err != nil {
		tb.Fatalf("pgserver: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			tb.Fatalf("pgserver: %v", err)
		}
	}
	s.dir = dir
	s.run(startTimeout, "initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	settings := append([]string{"listen_addresses=127.0.0.1", "fsync=off", "max_connections=100"}, extra...)
	var opts []string
	for _, kv := range settings {
		opts = append(opts, "-c "+kv)
	}
	// A free port can be taken by another process between the probe and
	// the server's bind: try a few.
	for attempt := 1; ; attempt++ {
		s.port = freePort(tb)
		s.options = fmt.Sprintf("-p %d -k %s %s", s.port, s.dir, strings.Join(opts, " "))
		err := s.try(startTimeout, "pg_ctl", "-D", s.data(), "-l", s.LogFile(), "-o", s.options, "-w", "-t", "60", "start")
		if err == nil {
			break
		}
		if attempt == 3 {
			tb.Fatalf("pgserver: starting the server: %v\n%s", err, s.Log())
		}
	}
	tb.Cleanup(func() {
		s.try(stopTimeout, "pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "-t", "30", "stop")
	})
	s.waitReady()
	return s
}

// DSN returns the URL of database name on the server, as user postgres.
func (s *Server) DSN(name string) string { return s.UserDSN("postgres", name) }

// UserDSN returns the URL of database name on the server, as role user.
func (s *Server) UserDSN(user, name string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", user, s.port, name)
}

// CreateDatabase creates an empty database and returns its URL.
func (s *Server) CreateDatabase(name string) string {
	s.tb.Helper()
	s.Exec("postgres", "CREATE DATABASE "+name)
	return s.DSN(name)
}

// Exec runs statements on database name, on a connection of its own.
func (s *Server) Exec(name string, statements ...string) {
	s.tb.Helper()
	db := s.Open(name)
	defer db.Close()
	for _, q := range statements {
		if _, err := db.Exec(q); err != nil {
			s.tb.Fatalf("pgserver: %s: %v", q, err)
		}
	}
}

// Open returns a pool on database name, closed when the test ends.
func (s *Server) Open(name string) *sql.DB {
	s.tb.Helper()
	db, err := sql.Open("pgx", s.DSN(name))
	if err != nil {
		s.tb.Fatalf("pgserver: %v", err)
	}
	s.tb.Cleanup(func() { db.Close() })
	return db
}

// Stop stops the server: mode is pg_ctl's "smart", "fast" or
// "immediate" (a crash: the next start recovers from the WAL).
func (s *Server) Stop(mode string) {
	s.tb.Helper()
	s.run(stopTimeout, "pg_ctl", "-D", s.data(), "-m", mode, "-w", "-t", "30", "stop")
}

// Restart starts a stopped server again, on the same port.
func (s *Server) Restart() {
	s.tb.Helper()
	s.run(startTimeout, "pg_ctl", "-D", s.data(), "-l", s.LogFile(), "-o", s.options, "-w", "-t", "60", "start")
	s.waitReady()
}

// LogFile is the server's log.
func (s *Server) LogFile() string { return filepath.Join(s.dir, "server.log") }

// Log returns the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.LogFile())
	return string(b)
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// waitReady waits until the server accepts connections on its TCP port,
// which pg_ctl -w alone does not promise for the port (it may check the
// socket).
func (s *Server) waitReady() {
	s.tb.Helper()
	// A real process started on real time: its start-up is paced by a
	// real timer, which has no bearing on lock expiry.
	giveUp := time.After(startTimeout)
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		err := s.try(10*time.Second, "pg_isready", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-d", "postgres")
		if err == nil {
			return
		}
		select {
		case <-giveUp:
			s.tb.Fatalf("pgserver: the server is not ready after %v: %v\n%s", startTimeout, err, s.Log())
		case <-poll.C:
		}
	}
}

// run runs one of the server's commands and fails the test if it fails.
func (s *Server) run(timeout time.Duration, name string, args ...string) {
	s.tb.Helper()
	if err := s.try(timeout, name, args...); err != nil {
		s.tb.Fatalf("pgserver: %v\n%s", err, s.Log())
	}
}

// try runs one of the server's commands as the server's user. Its output
// goes to a file, not a pipe: pg_ctl start leaves the server running, and
// a pipe the server inherited would keep Wait waiting.
func (s *Server) try(timeout time.Duration, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := os.CreateTemp(s.dir, "cmd-*.out")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, b)
	}
	return nil
}

// binDir finds the directory of the server's binaries: pg_config's, or
// Debian's /usr/lib/postgresql/<version>/bin (the newest), or the PATH's.
func binDir() string {
	has := func(dir string) bool {
		_, err1 := os.Stat(filepath.Join(dir, "initdb"))
		_, err2 := os.Stat(filepath.Join(dir, "pg_ctl"))
		return err1 == nil && err2 == nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p)
	}
	return ""
}

// version is the major version in /usr/lib/postgresql/<version>/bin.
func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

func credential(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %s has a non-numeric id", name)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pgserver: finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
