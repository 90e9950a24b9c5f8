package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// Several OS processes share one SQLite file. Each loops
// acquire -> critical section -> release over a few resources; inside the
// critical section it proves exclusivity with a witness that does not
// trust the lock service: an O_EXCL marker file per resource, created on
// entry and removed on exit, and an append-only log of entries per
// resource that the parent reads back afterwards.
//
// The worker side runs when the test binary is re-executed with
// LOCKS_TEST_WORKER set; see TestMain.

const (
	envWorker   = "LOCKS_TEST_WORKER"
	envDB       = "LOCKS_TEST_DB"
	envDir      = "LOCKS_TEST_DIR"
	envOwner    = "LOCKS_TEST_OWNER"
	envDuration = "LOCKS_TEST_DURATION"
	// LOCKS_STRESS_DURATION runs the multi-process test (and, for a third
	// of it, the goroutine test) longer than the default 6 s, e.g.
	// LOCKS_STRESS_DURATION=2m go test ./tests -run 'Processes|Goroutines'.
	envStress = "LOCKS_STRESS_DURATION"
	// LOCKS_CRASH_ROUNDS sets how many processes TestCrash_KilledMidWrite
	// kills (default 12).
	envCrashRounds = "LOCKS_CRASH_ROUNDS"
)

var stressResources = []domain.ResourceRef{
	{Type: domain.ResourcePlan, ID: "alpha"},
	{Type: domain.ResourcePlan, ID: "beta"},
	{Type: domain.ResourceProject, ID: "gamma"},
}

func TestMain(m *testing.M) {
	switch os.Getenv(envWorker) {
	case "":
		goleak.VerifyTestMain(m)
	case "loop":
		os.Exit(workerLoop())
	case "hold":
		os.Exit(workerHold())
	case "churn":
		os.Exit(workerChurn())
	case "fight":
		os.Exit(workerFight())
	case "wait":
		os.Exit(workerWait())
	case "claim":
		os.Exit(workerClaim())
	case "holdDo":
		os.Exit(workerHoldDo())
	case "fifo":
		os.Exit(workerFIFO())
	default:
		fmt.Fprintln(os.Stderr, "unknown worker", os.Getenv(envWorker))
		os.Exit(2)
	}
}

// workerStats is what a loop worker reports on stdout.
type workerStats struct {
	Owner     string         `json:"owner"`
	Entries   int            `json:"entries"`
	Conflicts int            `json:"conflicts"`
	Overlaps  int            `json:"overlaps"`
	Errors    map[string]int `json:"errors"` // anything but a conflict, by message
}

func workerLoop() int {
	dur, _ := time.ParseDuration(os.Getenv(envDuration))
	dir, owner := os.Getenv(envDir), os.Getenv(envOwner)
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: owner})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer c.Close()
	st := workerStats{Owner: owner, Errors: map[string]int{}}
	// At least dur, and until this worker got in a few times: a loaded
	// machine may give its process a CPU late. Ten times dur bounds a
	// worker that never gets in, which the test then reports as starved.
	start := time.Now()
	for i := 0; ; i++ {
		if ran := time.Since(start); ran >= 10*dur || (ran >= dur && st.Entries >= 10) {
			break
		}
		ref := stressResources[i%len(stressResources)]
		l, err := c.Locks.Acquire(ctx, owner, ref, time.Minute)
		if errors.Is(err, domain.ErrConflict) {
			st.Conflicts++
			continue
		}
		if err != nil {
			st.Errors[err.Error()]++
			continue
		}
		st.Entries++
		if !witnessEnter(dir, ref, owner, l.Token) {
			st.Overlaps++
		}
		if ok, err := c.Locks.Release(ctx, owner, ref); err != nil || !ok {
			st.Errors[fmt.Sprintf("release: %v %v", ok, err)]++
		}
	}
	return reportJSON(st)
}

// witnessEnter runs the critical section: it creates the resource's marker
// exclusively (failing if anyone else is inside), appends "token owner" to
// the resource's log, and removes the marker. It reports false on overlap.
func witnessEnter(dir string, ref domain.ResourceRef, owner string, token int64) bool {
	name := string(ref.Type) + "-" + ref.ID
	marker := filepath.Join(dir, name+".held")
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	logf, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err == nil {
		fmt.Fprintf(logf, "%d %s\n", token, owner)
		logf.Close()
	}
	return os.Remove(marker) == nil
}

func reportJSON(v any) int {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		return 1
	}
	return 0
}

// startWorker re-executes the test binary as a worker.
func startWorker(t *testing.T, kind string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{envWorker + "=" + kind}, env...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

func stressDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(envStress)); err == nil && d > 0 {
		return d
	}
	if testing.Short() {
		return 2 * time.Second
	}
	return 6 * time.Second
}

func TestProcesses_MutualExclusion(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) {
		runProcesses(t, filepath.Join(t.TempDir(), "agents.db"))
	})
	t.Run("PostgreSQL", func(t *testing.T) { runProcesses(t, testdb.Postgres(t)) })
}

// runProcesses runs the workers on db, a SQLite file or a PostgreSQL DSN.
func runProcesses(t *testing.T, db string) {
	const procs = 4
	dir := t.TempDir() // the witnesses
	// Create the database first so that the workers race on locks, not on the
	// migration (TestOpen_ConcurrentFirstOpen covers that race).
	c, err := locks.Open(context.Background(), locks.Config{Database: db})
	require.NoError(t, err)
	require.NoError(t, c.Close())

	dur := stressDuration()
	var (
		wg    sync.WaitGroup
		stats = make([]workerStats, procs)
	)
	for i := range procs {
		cmd := startWorker(t, "loop", envDB+"="+db, envDir+"="+dir,
			envOwner+"=proc-"+strconv.Itoa(i), envDuration+"="+dur.String())
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, json.NewDecoder(out).Decode(&stats[i]), "worker %d report", i)
			assert.NoError(t, cmd.Wait(), "worker %d", i)
		}()
	}
	wg.Wait()

	var entries, conflicts, overlaps int
	for _, st := range stats {
		entries += st.Entries
		conflicts += st.Conflicts
		overlaps += st.Overlaps
		assert.Empty(t, st.Errors, "%s saw errors other than conflicts", st.Owner)
		assert.Positive(t, st.Entries, "%s never got in: writers starve", st.Owner)
	}
	assert.Zero(t, overlaps, "two owners were inside one critical section")

	handoffs := 0
	for _, ref := range stressResources {
		tokens, owners := readWitnessLog(t, filepath.Join(dir, string(ref.Type)+"-"+ref.ID+".log"))
		for i := 1; i < len(tokens); i++ {
			require.Greater(t, tokens[i], tokens[i-1], "%s: tokens must increase in the order of entry", ref)
			if owners[i] != owners[i-1] {
				handoffs++
			}
		}
	}
	assert.Equal(t, entries, countLines(t, dir), "every entry is in a witness log")
	t.Logf("%d processes, %v: %d entries, %d handoffs between processes, %d conflicts, %d overlaps",
		procs, dur, entries, handoffs, conflicts, overlaps)
	assert.Greater(t, handoffs, 10, "resources must change hands between processes")
}

func readWitnessLog(t *testing.T, path string) (tokens []int64, owners []string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		tok, owner, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(tok, 10, 64)
		require.NoError(t, err)
		tokens, owners = append(tokens, n), append(owners, owner)
	}
	require.NoError(t, sc.Err())
	return tokens, owners
}

func countLines(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	for _, ref := range stressResources {
		tokens, _ := readWitnessLog(t, filepath.Join(dir, string(ref.Type)+"-"+ref.ID+".log"))
		n += len(tokens)
	}
	return n
}
