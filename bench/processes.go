package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// Several processes on one SQLite file: the bench binary starts copies of
// itself as workers, each cycling resources of its own on the same file
// for a fixed time; they start together on a word from the parent.

// workerEnv, when set, makes the binary a worker of that contender
// ("module-sqlite" or "floor-sqlite"); workerDBEnv names the file and
// workerIDEnv the worker.
const (
	workerEnv   = "LOCKS_BENCH_WORKER"
	workerDBEnv = "LOCKS_BENCH_DB"
	workerIDEnv = "LOCKS_BENCH_ID"
)

// maxWorkerErrors ends a worker whose operations keep failing.
const maxWorkerErrors = 1000

// workerReport is what a worker writes to its parent when its time is up.
type workerReport struct {
	Cycles    int     `json:"cycles"`
	Errors    int     `json:"errors"` // failed acquires or releases, retried
	ElapsedNS int64   `json:"elapsed_ns"`
	CyclesNS  []int64 `json:"cycles_ns"` // how long each cycle took, retries included
	Fatal     string  `json:"fatal,omitempty"`
	Grants    []int   `json:"grants,omitempty"` // a fairness worker's grants per waiter
}

// procResult is one contender's multi-process figures over all rounds.
type procResult struct {
	contender string
	rates     []float64 // total cycles/s of each round
	fairness  []float64 // slowest process's cycles ÷ fastest's, each round
	latencies []time.Duration
	errors    int
}

// runProcesses runs opts.procRounds rounds of opts.processes workers, for
// opts.procFor each, of the module and of the floor, alternating.
func runProcesses(ctx context.Context, env *environment, opts options) ([]*procResult, error) {
	var out []*procResult
	paths := map[string]string{}
	for _, name := range []string{"module-sqlite", "floor-sqlite"} {
		if !wants(opts.contenders, name) {
			continue
		}
		paths[name] = env.file("processes-" + name)
		if err := createSchema(ctx, paths[name]); err != nil {
			return nil, err
		}
		out = append(out, &procResult{contender: name})
	}
	for round := range opts.procRounds {
		for k := range out {
			r := out[(k+round)%len(out)]
			reports, err := runWorkers(ctx, env, r.contender, paths[r.contender], opts.processes, opts.procFor)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", r.contender, err)
			}
			var total int
			var elapsed time.Duration
			counts := make([]int, len(reports))
			for i, w := range reports {
				total += w.Cycles
				counts[i] = w.Cycles
				elapsed = max(elapsed, time.Duration(w.ElapsedNS))
				r.errors += w.Errors
				for _, ns := range w.CyclesNS {
					r.latencies = append(r.latencies, time.Duration(ns))
				}
			}
			r.rates = append(r.rates, float64(total)/elapsed.Seconds())
			if hi := slices.Max(counts); hi > 0 {
				r.fairness = append(r.fairness, float64(slices.Min(counts))/float64(hi))
			}
		}
	}
	for _, r := range out {
		slices.Sort(r.latencies)
	}
	return out, nil
}

// runWorkers starts n workers of mode on path, waits until each has
// opened the file, lets them all go for d, and collects their reports.
func runWorkers(ctx context.Context, env *environment, mode, path string, n int, d time.Duration) ([]workerReport, error) {
	workers := make([]worker, n)
	defer func() {
		for _, w := range workers {
			if w.cmd != nil && w.cmd.Process != nil {
				_ = w.cmd.Process.Kill() // only if it is still running after an error
				_ = w.cmd.Wait()
			}
		}
	}()
	for i := range workers {
		w, err := startWorker(ctx, env, mode, path, strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		workers[i] = w
	}
	for i, w := range workers {
		line, err := w.out.ReadString('\n')
		if err != nil || line != "ready\n" {
			return nil, fmt.Errorf("worker %d did not start: %q %v", i, line, err)
		}
	}
	for _, w := range workers {
		if _, err := fmt.Fprintf(w.stdin, "go %d\n", d.Nanoseconds()); err != nil {
			return nil, err
		}
	}
	reports := make([]workerReport, n)
	for i, w := range workers {
		if err := json.NewDecoder(w.out).Decode(&reports[i]); err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		if reports[i].Fatal != "" {
			return nil, fmt.Errorf("worker %d: %s", i, reports[i].Fatal)
		}
	}
	for i := range workers {
		if err := workers[i].cmd.Wait(); err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		workers[i].cmd = nil
	}
	return reports, nil
}

// worker is a copy of the bench binary in a worker mode, spoken to
// through its standard input and output.
type worker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startWorker starts the worker id of mode on target (a file or a DSN);
// its standard error goes to the log.
func startWorker(ctx context.Context, env *environment, mode, target, id string) (worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return worker{}, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+mode, workerDBEnv+"="+target, workerIDEnv+"="+id)
	cmd.Stderr = env.log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return worker{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return worker{}, err
	}
	if err := cmd.Start(); err != nil {
		return worker{}, err
	}
	return worker{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}, nil
}

// workerMain is a worker's life: open the store, say "ready", wait for
// "go <nanoseconds>", cycle for that long, and report as JSON.
func workerMain(mode string, stdin io.Reader, stdout io.Writer) int {
	if strings.HasPrefix(mode, "handover-") || mode == stampMode || mode == fairMode {
		return handoverWorkerMain(mode, stdin, stdout)
	}
	if mode == lossMode {
		return lossWorkerMain(stdin, stdout)
	}
	ctx := context.Background()
	id := os.Getenv(workerIDEnv)
	acquire, release, closeStore, err := openWorkerStore(ctx, mode, os.Getenv(workerDBEnv), "bench-worker-"+id)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer closeStore()
	// One cycle before the start, so that the measured ones do not pay for
	// connections and prepared statements.
	warm := fmt.Sprintf("warm-up-%s", id)
	if err := acquire(ctx, warm); err == nil {
		err = release(ctx, warm)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: warm-up:", err)
		return 1
	}
	fmt.Fprintln(stdout, "ready")
	line, err := bufio.NewReader(stdin).ReadString('\n')
	ns, perr := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "go ")), 10, 64)
	if err != nil || perr != nil {
		fmt.Fprintf(os.Stderr, "worker: expected \"go <nanoseconds>\", read %q\n", line)
		return 1
	}
	var rep workerReport
	ids := ownRefs(atoiOr(id))
	start := time.Now()
	deadline := start.Add(time.Duration(ns))
	for k := 0; time.Now().Before(deadline) && rep.Fatal == ""; k++ {
		t0 := time.Now()
		for _, op := range []func(context.Context, string) error{acquire, release} {
			for {
				err := op(ctx, ids[k%ownResources])
				if err == nil {
					break
				}
				if rep.Errors++; rep.Errors >= maxWorkerErrors {
					rep.Fatal = fmt.Sprintf("%d failed operations, the last: %v", rep.Errors, err)
					break
				}
			}
		}
		rep.CyclesNS = append(rep.CyclesNS, time.Since(t0).Nanoseconds())
		rep.Cycles++
	}
	rep.ElapsedNS = time.Since(start).Nanoseconds()
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		return 1
	}
	return 0
}

func atoiOr(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// openWorkerStore opens the module's container, or the floor, on path for
// owner, and returns its acquire and release of a resource id.
func openWorkerStore(ctx context.Context, mode, path, owner string) (acquire, release func(context.Context, string) error, closeStore func(), err error) {
	ref := func(id string) domain.ResourceRef { return domain.ResourceRef{Type: domain.ResourcePlan, ID: id} }
	switch mode {
	case "module-sqlite":
		c, err := locks.Open(ctx, locks.Config{Database: path, Owner: owner})
		if err != nil {
			return nil, nil, nil, err
		}
		acquire = func(ctx context.Context, id string) error {
			_, err := c.Locks.Acquire(ctx, owner, ref(id), lockTTL)
			return err
		}
		release = func(ctx context.Context, id string) error { return released(c.Locks.Release(ctx, owner, ref(id))) }
		return acquire, release, func() { _ = c.Close() }, nil
	case "floor-sqlite":
		f, err := openFloorFile(ctx, path)
		if err != nil {
			return nil, nil, nil, err
		}
		acquire = func(ctx context.Context, id string) error { return f.acquire(ctx, owner, id) }
		release = func(ctx context.Context, id string) error { return f.release(ctx, owner, id) }
		return acquire, release, func() { _ = f.close() }, nil
	}
	return nil, nil, nil, errors.New("unknown worker mode " + mode)
}
