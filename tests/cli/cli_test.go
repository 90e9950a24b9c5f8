// Package cli tests the agents binary end to end: TestMain builds it once,
// and every test runs it as a separate process against a temporary
// database, as scripts and operators do.
package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// agentsBin is the binary that TestMain builds.
var agentsBin string

func TestMain(m *testing.M) {
	if db := os.Getenv(envHoldWriteLock); db != "" {
		os.Exit(holdWriteLock(db))
	}
	if stamps := os.Getenv(envWriteStamps); stamps != "" {
		os.Exit(writeStamps(stamps, os.Args[1]))
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "agents-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentsBin = filepath.Join(dir, "agents")
	build := exec.Command("go", "build", "-o", agentsBin, "github.com/cleveragents/locks/cmd/agents")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building agents:", err)
		return 1
	}
	return m.Run()
}

// lockKeys are the keys of a lock in JSON output; scripts depend on them.
var lockKeys = []string{"token", "owner_id", "resource_type", "resource_id", "acquired_at", "expires_at"}

// agents runs the binary with an environment of its own: a home, a data
// directory, a time zone and the PATH in which "locks run" finds its
// commands, and nothing of the test process's AGENTS_*. AGENTS_CREATE=1
// lets acquire and run create the test's database, as most tests need;
// TestCLI_CreateOnlyWhenAsked runs without it.
type agents struct {
	t   *testing.T
	dir string
	db  string
	env []string
	// wd is the working directory of the commands; "" is the test's.
	wd string
}

func newAgents(t *testing.T) *agents {
	dir := t.TempDir()
	return &agents{t: t, dir: dir, db: filepath.Join(dir, "agents.db"), env: []string{
		"HOME=" + filepath.Join(dir, "home"),
		"XDG_DATA_HOME=" + filepath.Join(dir, "data"),
		"TZ=UTC",
		"PATH=" + os.Getenv("PATH"),
		"AGENTS_CREATE=1",
	}}
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs agents with --db set to the test's database.
func (a *agents) run(args ...string) result {
	a.t.Helper()
	return a.runEnv(nil, append([]string{"--db", a.db}, args...)...)
}

// runEnv runs agents with extra environment variables and no --db.
func (a *agents) runEnv(env []string, args ...string) result {
	a.t.Helper()
	r := a.runProgram(env, agentsBin, args...)
	assert.NotContains(a.t, r.stderr, "goroutine ", "no stack trace, ever")
	return r
}

// runProgram runs a program in the test's environment and env.
func (a *agents) runProgram(env []string, name string, args ...string) result {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(slices.Clone(a.env), env...)
	cmd.Dir = a.wd
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(a.t, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// mustRun runs a command that must exit 0.
func (a *agents) mustRun(args ...string) result {
	a.t.Helper()
	r := a.run(args...)
	require.Equal(a.t, 0, r.code, "agents %v\nstdout: %s\nstderr: %s", args, r.stdout, r.stderr)
	return r
}

// decode parses stdout, which must be exactly one JSON document.
func (r result) decode(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(r.stdout)))
	require.NoError(t, dec.Decode(v), "stdout: %s", r.stdout)
	require.False(t, dec.More(), "more than one JSON document on stdout: %s", r.stdout)
}

// assertKeys checks that a JSON object has exactly the keys given.
func assertKeys(t *testing.T, obj map[string]any, keys ...string) {
	t.Helper()
	got := make([]string, 0, len(obj))
	for k := range obj {
		got = append(got, k)
	}
	assert.ElementsMatch(t, keys, got)
}

// lock is a lock as JSON output shows it.
type lock struct {
	Token        int64     `json:"token"`
	OwnerID      string    `json:"owner_id"`
	ResourceType string    `json:"resource_type"`
	ResourceID   string    `json:"resource_id"`
	AcquiredAt   time.Time `json:"acquired_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	Expired      bool      `json:"expired"`
}

// seedExpired stores locks on the given plans that expired an hour ago,
// as a process that died without cleaning up would leave them. It writes
// through the library with a clock set in the past, and closes the store.
func seedExpired(t *testing.T, db string, ids ...string) {
	t.Helper()
	c := openPast(t, db, ids...)
	require.NoError(t, c.Close())
}

// openPast opens db through the library with a clock two hours back, holds
// a five-minute lock on each given plan, and leaves the store open.
func openPast(t *testing.T, db string, ids ...string) *locks.Container {
	t.Helper()
	clk := clock.NewMock()
	clk.Set(time.Now().Add(-2 * time.Hour))
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: db, Owner: "ghost", Clock: clk, LocalTime: true, KeepLocksOnClose: true})
	require.NoError(t, err)
	for _, id := range ids {
		_, err := c.Locks.Acquire(ctx, "ghost", domain.ResourceRef{Type: domain.ResourcePlan, ID: id}, 5*time.Minute)
		require.NoError(t, err)
	}
	return c
}

// snapshot is what must not change in a database's directory: every file
// there, with its digest.
func snapshot(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string][32]byte{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = sha256.Sum256(b)
	}
	return out
}
