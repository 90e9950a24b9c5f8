//go:build unix

package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rules of "agents locks run", and "locks acquire --wait", each on the
// real binary, with real processes, signals and time. The tests that need
// a lock to expire use the shortest TTL, 5s; the others wait for nothing
// but their commands.

// proc is an agents process running in the background.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
}

// start starts agents with --db set to the test's database.
func (a *agents) start(args ...string) *proc {
	a.t.Helper()
	p := &proc{t: a.t, done: make(chan struct{})}
	p.cmd = exec.Command(agentsBin, append([]string{"--db", a.db}, args...)...)
	p.cmd.Env = slices.Clone(a.env)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// A command that outlives agents keeps its output pipes open: do not
	// wait for it, once agents has exited.
	p.cmd.WaitDelay = time.Second
	require.NoError(a.t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	a.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for agents to exit, at most 30 seconds, and returns its
// result.
func (p *proc) wait() result {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		require.FailNow(p.t, "agents did not exit", "stderr: %s", p.stderr.String())
	}
	r := result{code: p.cmd.ProcessState.ExitCode(), stdout: p.stdout.String(), stderr: p.stderr.String()}
	assert.NotContains(p.t, r.stderr, "goroutine ", "no stack trace, ever")
	return r
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
}

// awaitPID waits until the command agents runs has written its pid to
// path, which it does once it is ready, and returns the pid.
func (p *proc) awaitPID(path string) int {
	p.t.Helper()
	pids := p.awaitPIDs(path)
	require.Len(p.t, pids, 1, "%s holds one pid", path)
	return pids[0]
}

// awaitPIDs waits until the command agents runs has written its pids, on
// one line, to path, and returns them; they are killed when the test ends.
// If agents exits first (it could not open its store or take the lock),
// the test fails at once with what agents printed.
func (p *proc) awaitPIDs(path string) []int {
	p.t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if pids := readPIDs(path); pids != nil {
			p.t.Cleanup(func() {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			return pids
		}
		select {
		case <-p.done:
			require.FailNow(p.t, "agents exited before its command was ready",
				"exit code %d; the command never wrote %s\nstdout: %s\nstderr: %s",
				p.cmd.ProcessState.ExitCode(), path, p.stdout.String(), p.stderr.String())
		case <-deadline:
			require.FailNow(p.t, "the command never wrote its pids", "%s; agents is still running", path)
		case <-tick.C:
		}
	}
}

// readPIDs returns the pids on the line in path, or nil until the line is
// whole.
func readPIDs(path string) []int {
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil
		}
		pids = append(pids, pid)
	}
	return pids
}

// dead reports whether process pid has ended: it is gone, or a zombie that
// nobody has reaped yet.
func dead(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == syscall.ESRCH
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] == "Z"
}

// holders returns who holds what: resource id to owner, active locks only.
func (a *agents) holders() map[string]string {
	a.t.Helper()
	var ls []lock
	a.mustRun("--json", "locks", "list").decode(a.t, &ls)
	out := map[string]string{}
	for _, l := range ls {
		out[l.ResourceID] = l.OwnerID
	}
	return out
}

// runDoc is the JSON output of locks run.
type runDoc struct {
	Lock    lock `json:"lock"`
	Command struct {
		PID      int  `json:"pid"`
		ExitCode int  `json:"exit_code"`
		Signal   *int `json:"signal"`
	} `json:"command"`
	Lost *struct {
		Reason    string `json:"reason"`
		Message   string `json:"message"`
		At        string `json:"at"`
		NewHolder *lock  `json:"new_holder"`
	} `json:"lost"`
	Released bool `json:"released"`
}

// The commands' scripts. Each writes its pid to its first argument ("$0")
// once it is ready.
const (
	// stopsOnTerm writes "$1" and exits 0 on SIGTERM.
	stopsOnTerm = `trap 'echo TERM > "$1"; exit 0' TERM; echo $$ > "$0"; while :; do sleep 0.05; done`
	// ignoresTerm ignores SIGTERM, which the exec'd sleep inherits.
	ignoresTerm = `trap '' TERM; echo $$ > "$0"; exec sleep 60`
)

// TestCLIRun_Environment: CMD gets the lock's token, owner and resource, the
// lock is held while it runs and released when it ends, and agents exits
// with CMD's status.
func TestCLIRun_Environment(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	during := filepath.Join(a.dir, "during.json")
	r := a.run("--owner", "alice", "locks", "run", "plan", "p1", "--", "sh", "-c",
		`echo "$AGENTS_LOCK_TOKEN|$AGENTS_LOCK_OWNER|$AGENTS_LOCK_RESOURCE"; "$0" --db "$1" --json locks list > "$2"; exit 7`,
		agentsBin, a.db, during)
	assert.Equal(t, 7, r.code, "stderr: %s", r.stderr)
	assert.Equal(t, "1|alice|plan/p1\n", r.stdout)
	assert.Empty(t, r.stderr)

	var held []lock
	b, err := os.ReadFile(during)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &held))
	require.Len(t, held, 1, "held while the command ran")
	assert.Equal(t, "alice", held[0].OwnerID)
	assert.Empty(t, a.holders(), "released when the command ended")
}

// TestCLIRun_ExitStatus: CMD's exit code, or 128+N when signal N killed it;
// the lock is released in every case.
func TestCLIRun_ExitStatus(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	for _, tc := range []struct {
		name   string
		script string
		want   int
	}{
		{"Zero", `exit 0`, 0},
		{"Seven", `exit 7`, 7},
		{"KilledBySIGKILL", `kill -KILL $$`, 128 + 9},
		{"KilledBySIGTERM", `kill -TERM $$`, 128 + 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := a.run("--owner", "alice", "locks", "run", "plan", "p1", "--", "sh", "-c", tc.script)
			assert.Equal(t, tc.want, r.code, "stderr: %s", r.stderr)
			assert.Empty(t, a.holders())
		})
	}
	t.Run("JSON", func(t *testing.T) {
		r := a.run("--json", "--owner", "alice", "locks", "run", "plan", "p1", "--", "sh", "-c", `echo out; kill -TERM $$`)
		assert.Equal(t, 143, r.code)
		var doc runDoc
		r.decode(t, &doc)
		assert.Equal(t, "alice", doc.Lock.OwnerID)
		assert.Equal(t, 143, doc.Command.ExitCode)
		require.NotNil(t, doc.Command.Signal)
		assert.Equal(t, 15, *doc.Command.Signal)
		assert.Nil(t, doc.Lost)
		assert.True(t, doc.Released)
		assert.Equal(t, "out\n", r.stderr, "the command's stdout goes to stderr with --json")
	})
	t.Run("NotFound", func(t *testing.T) {
		r := a.run("--owner", "alice", "locks", "run", "plan", "p1", "--", "no-such-command-here")
		assert.Equal(t, 127, r.code)
		assert.Contains(t, r.stderr, `command not found: "no-such-command-here"`)
	})
}

// TestCLIRun_DefaultOwner: without --owner or AGENTS_OWNER, the owner is an
// id of the agents process.
func TestCLIRun_DefaultOwner(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	p := a.start("locks", "run", "plan", "p1", "--", "sh", "-c", `echo "$AGENTS_LOCK_OWNER"`)
	r := p.wait()
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	host, err := os.Hostname()
	require.NoError(t, err)
	// host:pid:nonce, then (on Linux) the proof of the process: boot id,
	// pid namespace and start time, and the command's process group.
	assert.Regexp(t, fmt.Sprintf(`^%s:%d:[0-9a-f]{8}(/proc1:[0-9a-f-]{36}:[0-9]+:[0-9]+:g[0-9]+)?\n$`, regexp.QuoteMeta(host), p.cmd.Process.Pid), r.stdout)
}

// TestCLIRun_ForwardsSignals: SIGINT, SIGTERM and SIGHUP sent to agents
// reach CMD; agents waits for it, releases the lock and exits with CMD's
// status. (SIGHUP, a closed terminal or a shell's hangup of its jobs, used
// to kill agents with 129 while CMD ran on under a lock nobody renewed.)
func TestCLIRun_ForwardsSignals(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(strings.ToUpper(sig.String()[:1])+sig.String()[1:], func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			ready, got := filepath.Join(a.dir, "ready"), filepath.Join(a.dir, "got")
			// The command takes its time to stop: the lock stays held until
			// it has.
			p := a.start("--owner", "alice", "locks", "run", "plan", "p1", "--", "sh", "-c",
				`trap 'echo "$2" > "$1"; sleep 0.3; exit 42' INT TERM HUP; echo $$ > "$0"; while :; do sleep 0.05; done`,
				ready, got, sig.String())
			p.awaitPID(ready)
			p.signal(sig)
			r := p.wait()
			assert.Equal(t, 42, r.code, "the command's status; stderr: %s", r.stderr)
			b, err := os.ReadFile(got)
			require.NoError(t, err, "the command got the signal")
			assert.Equal(t, sig.String()+"\n", string(b))
			assert.Empty(t, a.holders(), "released once the command ended")
		})
	}
}

// TestCLIRun_LostLockStopsCommand stops agents with SIGSTOP past its TTL,
// lets another owner take the lock, and resumes agents. The keeper of
// CMD's group, which heard of no renewal, stopped CMD with SIGTERM before
// the expiry (see stopped_test.go); agents says so, notices the loss at
// once, exits 4, and the other owner keeps its lock. It waits about five
// seconds, the shortest TTL.
func TestCLIRun_LostLockStopsCommand(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	ready, term := filepath.Join(a.dir, "ready"), filepath.Join(a.dir, "term")
	p := a.start("--json", "--owner", "runner", "locks", "run", "plan", "p1", "--ttl", "5s", "--", "sh", "-c", stopsOnTerm, ready, term)
	pid := p.awaitPID(ready)

	p.signal(syscall.SIGSTOP)
	var ls []lock
	a.mustRun("--json", "locks", "list").decode(t, &ls)
	require.Len(t, ls, 1)
	time.Sleep(time.Until(ls[0].ExpiresAt) + 100*time.Millisecond)
	var taken lock
	a.mustRun("--json", "--owner", "other", "locks", "acquire", "plan", "p1").decode(t, &taken)
	p.signal(syscall.SIGCONT)

	r := p.wait()
	assert.Equal(t, 4, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, `the lock of owner "runner" on plan/p1 (token 1) was lost: owner "other" took it over (token 2)`)
	assert.Contains(t, r.stderr, "heard of no renewal of the lock before its expiry")
	// The keeper, which stopped the group ahead of the expiry, SIGKILLs
	// what is left a margin before the expiry, sooner than --grace (10s):
	// the message says when, not --grace.
	m := regexp.MustCompile(`SIGTERM, then SIGKILL (\S+) later`).FindStringSubmatch(r.stderr)
	require.NotNil(t, m, r.stderr)
	killIn, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	assert.Less(t, killIn, 5*time.Second, "the keeper's SIGKILL comes before the expiry of a 5s lock, not --grace later\nstderr: %s", r.stderr)
	assert.Contains(t, r.stderr, "before the lock's expiry, sooner than --grace 10s")
	assert.FileExists(t, term, "the command got SIGTERM")
	assert.Eventually(t, func() bool { return dead(pid) }, 5*time.Second, 10*time.Millisecond, "the command is stopped")
	var doc runDoc
	r.decode(t, &doc)
	require.NotNil(t, doc.Lost)
	assert.Equal(t, "taken_over", doc.Lost.Reason)
	require.NotNil(t, doc.Lost.NewHolder)
	assert.Equal(t, taken.Token, doc.Lost.NewHolder.Token)
	assert.False(t, doc.Released)
	assert.Equal(t, map[string]string{"p1": "other"}, a.holders(), "the other owner keeps its lock")
}

// TestCLIRun_GraceThenSIGKILL: a command that ignores SIGTERM gets SIGKILL
// once --grace has passed. The lock is lost without waiting for its TTL:
// it is released by hand, as its owner, and taken by another owner, which
// the next renewal (after ttl/2) finds.
func TestCLIRun_GraceThenSIGKILL(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	ready := filepath.Join(a.dir, "ready")
	p := a.start("--json", "--owner", "runner", "locks", "run", "plan", "p1", "--ttl", "5s", "--grace", "1s", "--",
		"sh", "-c", ignoresTerm, ready)
	pid := p.awaitPID(ready)
	a.mustRun("--owner", "runner", "locks", "release", "plan", "p1")
	a.mustRun("--owner", "other", "locks", "acquire", "plan", "p1")

	r := p.wait()
	assert.Equal(t, 4, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, "SIGTERM now, SIGKILL in 1s")
	assert.Contains(t, r.stderr, "was still running 1s after SIGTERM: sending SIGKILL")
	assert.True(t, dead(pid))
	var doc runDoc
	r.decode(t, &doc)
	assert.Equal(t, 128+9, doc.Command.ExitCode)
	require.NotNil(t, doc.Lost)
	assert.False(t, doc.Released)
	assert.Equal(t, map[string]string{"p1": "other"}, a.holders(), "the other owner keeps its lock")
}

// TestCLIRun_ParentDeath: when agents is killed with SIGKILL, and so can
// neither renew the lock nor stop CMD, the kernel kills CMD.
func TestCLIRun_ParentDeath(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux has a parent-death signal")
	}
	t.Parallel()
	a := newAgents(t)
	ready := filepath.Join(a.dir, "ready")
	p := a.start("--owner", "runner", "locks", "run", "plan", "p1", "--", "sh", "-c", `echo $$ > "$0"; exec sleep 60`, ready)
	pid := p.awaitPID(ready)
	require.False(t, dead(pid))
	p.signal(syscall.SIGKILL)
	p.wait()
	assert.Eventually(t, func() bool { return dead(pid) }, 5*time.Second, 10*time.Millisecond,
		"the command outlived agents")
}

// TestCLI_Wait: acquire --wait and run --wait take the lock once its holder
// releases it; acquire --wait --timeout gives up with exit 3.
func TestCLI_Wait(t *testing.T) {
	t.Parallel()
	for _, cmd := range [][]string{
		{"locks", "acquire", "plan", "p1", "--wait"},
		{"locks", "run", "plan", "p1", "--wait", "--", "sh", "-c", `echo "$AGENTS_LOCK_OWNER"`},
	} {
		t.Run(strings.Join(cmd[:2], ""), func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1", "--ttl", "1h")
			p := a.start(append([]string{"--owner", "B"}, cmd...)...)
			select {
			case <-p.done:
				require.FailNow(t, "the waiter did not wait", "stderr: %s", p.stderr.String())
			case <-time.After(300 * time.Millisecond):
			}
			a.mustRun("--owner", "A", "locks", "release", "plan", "p1")
			r := p.wait()
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			if cmd[1] == "run" {
				assert.Equal(t, "B\n", r.stdout)
				assert.Empty(t, a.holders())
			} else {
				assert.Contains(t, r.stdout, `Acquired plan/p1 for owner "B"`)
				assert.Equal(t, map[string]string{"p1": "B"}, a.holders())
			}
		})
	}
	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		a := newAgents(t)
		a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1", "--ttl", "1h")
		begin := time.Now()
		r := a.run("--json", "--owner", "B", "locks", "acquire", "plan", "p1", "--wait", "--timeout", "1s")
		assert.GreaterOrEqual(t, time.Since(begin), time.Second)
		assert.Equal(t, 3, r.code)
		assertConflict(t, r, "A")
		// How long it waited is measured: at least the timeout, and more
		// on a loaded machine, by how much the machine decides.
		assert.Regexp(t, `Gave up after waiting [1-9][0-9]*s \(--timeout\)\.`, r.stderr)
		var doc struct {
			Error struct {
				WaitedSeconds float64 `json:"waited_seconds"`
			} `json:"error"`
		}
		r.decode(t, &doc)
		assert.GreaterOrEqual(t, doc.Error.WaitedSeconds, 1.0)
	})
}

// TestCLI_HangupEndsAWait: SIGHUP ends a --wait as an interrupt does
// (exit 3, "Interrupted after waiting"), and "locks run" then runs nothing
// and takes nothing.
func TestCLI_HangupEndsAWait(t *testing.T) {
	t.Parallel()
	for _, cmd := range [][]string{
		{"locks", "acquire", "plan", "p1", "--wait"},
		{"locks", "run", "plan", "p1", "--wait", "--", "sh", "-c", `echo ran`},
	} {
		t.Run(strings.Join(cmd[:2], ""), func(t *testing.T) {
			t.Parallel()
			a := newAgents(t)
			a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1", "--ttl", "1h")
			p := a.start(append([]string{"--owner", "B"}, cmd...)...)
			// Waiting: the wait's first refusal is stored nowhere, so give
			// it time to start (a hangup earlier than that ends agents as
			// well, by the signal itself or by the same interrupt).
			select {
			case <-p.done:
				require.FailNow(t, "the waiter did not wait", "stderr: %s", p.stderr.String())
			case <-time.After(500 * time.Millisecond):
			}
			p.signal(syscall.SIGHUP)
			r := p.wait()
			assert.Equal(t, 3, r.code, "stderr: %s", r.stderr)
			assert.Contains(t, r.stderr, "Interrupted after waiting")
			assert.Empty(t, r.stdout)
			assert.Equal(t, map[string]string{"p1": "A"}, a.holders())
		})
	}
}

// TestCLI_RunDoesNotReenter: locks run holds its lock as one acquisition;
// the same owner's earlier acquire is another one, which run refuses as a
// conflict that names the same owner (its message used to call it another
// owner, and the docs promised a re-entry).
func TestCLI_RunDoesNotReenter(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	a.mustRun("--owner", "me", "locks", "acquire", "plan", "p1")
	r := a.run("--owner", "me", "locks", "run", "plan", "p1", "--", "true")
	assert.Equal(t, 3, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, `plan/p1 is held by another acquisition of the same owner "me"`)
	assert.Equal(t, map[string]string{"p1": "me"}, a.holders(), "the earlier lock stands")
}
