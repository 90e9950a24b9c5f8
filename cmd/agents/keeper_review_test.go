//go:build linux

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Review (promise 5): when agents dies, every process of CMD's group is
// killed. Break: SIGKILL the keeper first (agents does not notice), then
// SIGKILL agents. CMD dies of its parent-death signal, but CMD's own child
// lives on, in the group, unprotected; once the TTL runs out another owner
// acquires the lock while that child still runs.
func TestReview_KeeperKilledThenAgents_ChildOutlivesLock(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "agents")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	db := filepath.Join(dir, "t.db")
	pidFile := filepath.Join(dir, "child.pid")
	run := exec.Command(bin, "--db", db, "locks", "run", "plan", "p5", "--ttl", "5s", "--",
		"sh", "-c", "sleep 1000 & echo $! > "+pidFile+"; wait")
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	for i := 0; i < 100 && child == 0; i++ {
		time.Sleep(50 * time.Millisecond)
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if child == 0 {
		t.Fatal("child never started")
	}
	defer syscall.Kill(child, syscall.SIGKILL)
	pgid, _ := syscall.Getpgid(child) // the keeper's pid
	if err := syscall.Kill(pgid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill keeper %d: %v", pgid, err)
	}
	time.Sleep(300 * time.Millisecond)
	_ = run.Process.Kill()
	_ = run.Wait()
	time.Sleep(6 * time.Second) // past the TTL
	alive := syscall.Kill(child, 0) == nil
	out, err := exec.Command(bin, "--db", db, "--owner", "bob", "locks", "acquire", "plan", "p5").CombinedOutput()
	if alive && err == nil {
		t.Fatalf("CMD's child %d (group %d) still runs after agents was killed, and another owner acquired the lock:\n%s", child, pgid, out)
	}
}
