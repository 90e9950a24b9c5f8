//go:build linux

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// keeperSignals are the two ways the keeper stops guarding the group.
var keeperSignals = map[string]syscall.Signal{"killed": syscall.SIGKILL, "stopped": syscall.SIGSTOP}

// startKeeperRun builds agents and runs "locks run" with a 5 s lock over a
// shell that starts a background child; it returns the running agents,
// its stderr, the child's pid and the group's id (the keeper's pid).
func startKeeperRun(t *testing.T, dir, db string) (*exec.Cmd, *bytes.Buffer, int, int) {
	t.Helper()
	bin := filepath.Join(dir, "agents")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pidFile := filepath.Join(dir, "child.pid")
	run := exec.Command(bin, "--db", db, "locks", "run", "--create", "plan", "p5", "--ttl", "5s", "--",
		"sh", "-c", "sleep 1000 & echo $! > "+pidFile+"; wait")
	var stderr bytes.Buffer
	run.Stderr = &stderr
	// A surviving process of the group holds the stderr pipe open: Wait
	// must not wait for it, or a failing run would hang instead of fail.
	run.WaitDelay = 2 * time.Second
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	for i := 0; i < 200 && child == 0; i++ {
		time.Sleep(50 * time.Millisecond)
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if child == 0 {
		_ = run.Process.Kill()
		t.Fatalf("child never started; stderr:\n%s", &stderr)
	}
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	pgid, err := syscall.Getpgid(child)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pgid, syscall.SIGKILL) }) // a stopped keeper
	return run, &stderr, child, pgid
}

// The keeper kills CMD's group should agents die. If the keeper is killed
// or stopped first, and agents is then SIGKILLed, no process of CMD's
// group may outlive the lock: agents, which watches its keeper, kills the
// group the moment the keeper is gone. Once the TTL has run out, another
// owner takes the lock only if no process of the group is left.
func TestLockRun_KeeperGoneThenAgentsKilled(t *testing.T) {
	for name, sig := range keeperSignals {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, "t.db")
			run, _, child, pgid := startKeeperRun(t, dir, db)
			if err := syscall.Kill(pgid, sig); err != nil {
				t.Fatalf("signal keeper %d: %v", pgid, err)
			}
			time.Sleep(300 * time.Millisecond)
			_ = run.Process.Kill()
			_ = run.Wait()
			time.Sleep(6 * time.Second) // past the TTL
			alive := syscall.Kill(child, 0) == nil
			out, err := exec.Command(filepath.Join(dir, "agents"), "--db", db, "--owner", "bob",
				"locks", "acquire", "plan", "p5").CombinedOutput()
			if alive && err == nil {
				t.Fatalf("CMD's child %d (group %d) still runs after the keeper got %v and agents was killed, "+
					"and another owner acquired the lock:\n%s", child, pgid, sig, out)
			}
			if alive {
				t.Fatalf("CMD's child %d (group %d) outlived the keeper (%v) and agents", child, pgid, sig)
			}
		})
	}
}

// Without agents being killed: the moment the keeper dies or is stopped,
// agents kills CMD's whole group, says why, and exits 4.
func TestLockRun_KeeperGoneKillsGroupAndExits4(t *testing.T) {
	for name, sig := range keeperSignals {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			run, stderr, child, pgid := startKeeperRun(t, dir, filepath.Join(dir, "t.db"))
			if err := syscall.Kill(pgid, sig); err != nil {
				t.Fatalf("signal keeper %d: %v", pgid, err)
			}
			waited := make(chan error, 1)
			go func() { waited <- run.Wait() }()
			var err error
			select {
			case err = <-waited:
			case <-time.After(30 * time.Second): // a hang, not a speed goal
				_ = run.Process.Kill()
				t.Fatalf("agents did not end after its keeper got %v; stderr:\n%s", sig, stderr)
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != exitExpired {
				t.Fatalf("agents ended with %v, want exit %d; stderr:\n%s", err, exitExpired, stderr)
			}
			if !strings.Contains(stderr.String(), "keeper of the command's process group") {
				t.Fatalf("stderr does not say why:\n%s", stderr)
			}
			if want := map[string]string{"killed": "was killed by SIGKILL", "stopped": "was stopped by SIGSTOP"}[name]; !strings.Contains(stderr.String(), want) {
				t.Fatalf("stderr does not say %q:\n%s", want, stderr)
			}
			if syscall.Kill(child, 0) == nil {
				t.Fatalf("CMD's child %d still runs after agents ended", child)
			}
			if syscall.Kill(-pgid, 0) == nil {
				t.Fatalf("a process of group %d still runs after agents ended", pgid)
			}
		})
	}
}
