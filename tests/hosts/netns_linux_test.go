//go:build linux

package hosts

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Every namespace, veth and state file of a run carries the harness's
// pid, so that the leftovers of a run that was killed can be told from a
// run in progress and removed at the next start.
func nsName(pid, i int) string   { return fmt.Sprintf("locks-h%d-%d", pid, i) }
func rootVeth(pid, i int) string { return fmt.Sprintf("lh%dr%d", pid, i) }
func hostVeth(pid, i int) string { return fmt.Sprintf("lh%dn%d", pid, i) }
func stateFile(pid int) string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("locks-hosts-%d.pgdir", pid))
}
func rootAddr(pid, i int) string  { return fmt.Sprintf("10.213.%d.%d", pid%256, 4*i+1) }
func hostAddr(pid, i int) string  { return fmt.Sprintf("10.213.%d.%d", pid%256, 4*i+2) }
func ipCmd(args ...string) error  { return run("ip", args...) }
func hostName(i int) string       { return "h" + strconv.Itoa(i) }
func ownerName(i, gen int) string { return fmt.Sprintf("h%d-%d", i, gen) }

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// requireHosts skips unless the harness can run here.
func requireHosts(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the several-hosts harness skipped: it needs root, for network namespaces and veths (CI runs as root)")
	}
	for _, tool := range []string{"ip", "unshare", "hostname", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the several-hosts harness skipped: %s is not installed (iproute2 and util-linux provide ip and unshare)", tool)
		}
	}
	// pgserver.Start skips too without LOCKS_TEST_POSTGRES_DSN or the
	// server's binaries, saying so.
}

// addHost creates host i's namespace and its veth pair: rootAddr on the
// root side, hostAddr inside, a /30 of their own.
func addHost(pid, i int) error {
	ns, r, h := nsName(pid, i), rootVeth(pid, i), hostVeth(pid, i)
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"link", "add", r, "type", "veth", "peer", "name", h},
		{"link", "set", h, "netns", ns},
		{"addr", "add", rootAddr(pid, i) + "/30", "dev", r},
		{"link", "set", r, "up"},
		{"-n", ns, "addr", "add", hostAddr(pid, i) + "/30", "dev", h},
		{"-n", ns, "link", "set", h, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	return nil
}

// removeHosts removes what addHost made for run pid: the processes still
// in its namespaces, the namespaces, and the veths. It removes whatever is
// there and returns the first error.
func removeHosts(pid int) error {
	var errs []error
	out, _ := exec.Command("ip", "netns", "list").Output()
	prefix := fmt.Sprintf("locks-h%d-", pid)
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], prefix) {
			continue
		}
		pids, _ := exec.Command("ip", "netns", "pids", f[0]).Output()
		for _, p := range strings.Fields(string(pids)) {
			if n, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(n, syscall.SIGKILL)
				_ = syscall.Kill(n, syscall.SIGCONT)
			}
		}
		errs = append(errs, ipCmd("netns", "del", f[0]))
	}
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	vprefix := fmt.Sprintf("lh%dr", pid)
	for _, line := range strings.Split(string(links), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		// A veth whose peer's namespace was just deleted goes with it,
		// asynchronously: gone by now is as good as deleted.
		if !strings.HasPrefix(name, vprefix) {
			continue
		}
		if err := ipCmd("link", "del", name); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
		}
	}
	if b, err := os.ReadFile(stateFile(pid)); err == nil {
		errs = append(errs, killServer(strings.TrimSpace(string(b))))
		errs = append(errs, os.Remove(stateFile(pid)))
	}
	return errors.Join(errs...)
}

// killServer kills the private server whose directory is dir (pgserver's),
// if it still runs, and removes the directory.
func killServer(dir string) error {
	if !strings.HasPrefix(filepath.Base(dir), "locks-pg-") {
		return fmt.Errorf("%s is not a pgserver directory", dir)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
		first, _, _ := strings.Cut(string(b), "\n")
		if n, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && n > 1 {
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
	}
	return os.RemoveAll(dir)
}

// removeLeftovers removes what runs of the harness that are gone left
// behind: a run killed with SIGKILL cleans nothing up itself.
func removeLeftovers(t *testing.T) {
	seen := map[int]bool{}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		var pid, i int
		if f := strings.Fields(line); len(f) > 0 {
			if n, _ := fmt.Sscanf(f[0], "locks-h%d-%d", &pid, &i); n == 2 {
				seen[pid] = true
			}
		}
	}
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(links), "\n") {
		var pid, i int
		if f := strings.Fields(line); len(f) > 1 {
			if n, _ := fmt.Sscanf(f[1], "lh%dr%d", &pid, &i); n == 2 {
				seen[pid] = true
			}
		}
	}
	states, _ := filepath.Glob(filepath.Join(os.TempDir(), "locks-hosts-*.pgdir"))
	for _, s := range states {
		var pid int
		if n, _ := fmt.Sscanf(filepath.Base(s), "locks-hosts-%d.pgdir", &pid); n == 1 {
			seen[pid] = true
		}
	}
	for pid := range seen {
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // a run in progress
		}
		t.Logf("removing the leftovers of run %d", pid)
		if err := removeHosts(pid); err != nil {
			t.Logf("leftovers of run %d: %v", pid, err)
		}
	}
}
