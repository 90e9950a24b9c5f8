//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// runHandover measures the hand-over cases that the selected contenders
// call for: module-sqlite brings the SQLite cases and their flock
// references, module-postgres the PostgreSQL ones and pg_advisory_lock.
func runHandover(ctx context.Context, env *environment, selected []contender, opts options) (*handoverReport, error) {
	h := &handoverReport{}
	sqlite, pg := isSelected(selected, "module-sqlite"), isSelected(selected, "module-postgres")
	if !sqlite {
		h.skipped = append(h.skipped, "SQLite hand-over cases skipped: module-sqlite is not selected")
	}
	if !pg {
		h.skipped = append(h.skipped, "PostgreSQL hand-over cases skipped: module-postgres is not selected, or PostgreSQL does not answer")
	}
	if !sqlite && !pg {
		return h, nil
	}
	// A store of its own for each part: a file, or a schema.
	store := func(name string, postgres bool) (string, error) {
		if !postgres {
			path := env.file(name)
			return path, createSchema(ctx, path)
		}
		dsn, err := newSchema(ctx, env, name)
		if err != nil {
			return "", err
		}
		return dsn, createSchema(ctx, dsn)
	}

	var pairs []*pair
	defer func() {
		for _, p := range pairs {
			p.stop()
		}
	}()
	add := func(name, how, mode, target string) {
		p, err := startPair(ctx, env, mode, target)
		if err != nil {
			err = fmt.Errorf("%s: %w", name, err)
			fmt.Fprintln(env.log, "hand-over:", err)
		}
		p.c = &handoverCase{name: name, how: how, err: err}
		pairs = append(pairs, p)
		h.processes = append(h.processes, p.c)
	}
	if sqlite {
		db, err := store("handover", false)
		if err != nil {
			return nil, err
		}
		add("module-sqlite", "`Take` with `Wait`, `Handle.Release`, on one SQLite file", "handover-module", db)
		add("flock(2)", "`flock(LOCK_EX)` blocking, `flock(LOCK_UN)`, on one file", "handover-flock", env.file("flock"))
	}
	if pg {
		dsn, err := store("handover", true)
		if err != nil {
			return nil, err
		}
		add("module-postgres", "`Take` with `Wait`, `Handle.Release`, on PostgreSQL", "handover-module", dsn)
		add("pg_advisory_lock", "`SELECT pg_advisory_lock(k)` blocking, `pg_advisory_unlock(k)`, a connection per process", "handover-advisory", env.postgresDSN)
	}

	// 1–3: hand-overs between processes, the cases interleaved.
	for i := -1; i < opts.handovers; i++ {
		for k := range pairs {
			p := pairs[(k+max(i, 0))%len(pairs)]
			if p.c.err != nil {
				continue
			}
			s, err := p.handOver(ctx)
			if err != nil {
				p.c.err = err
				fmt.Fprintf(env.log, "hand-over, %s: %v\n", p.c.name, err)
				continue
			}
			if i >= 0 { // the first is a warm-up
				p.c.latencies = append(p.c.latencies, s.latency)
				if s.try >= 0 {
					p.c.tries = append(p.c.tries, s.try)
					p.c.wakes = append(p.c.wakes, max(0, s.latency-s.try))
					p.c.attempts = append(p.c.attempts, s.attempts)
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for _, p := range pairs {
		slices.Sort(p.c.latencies)
		slices.Sort(p.c.tries)
		slices.Sort(p.c.wakes)
	}

	// 6: what a blocked waiter costs, every case at once.
	fmt.Fprintf(env.log, "idle waiters: %v\n", opts.idleFor)
	h.idle = idleWaiters(ctx, pairs, opts.idleFor)
	for _, p := range pairs {
		p.stop()
	}
	pairs = nil

	// 4: through the CLI.
	var cli []cliCase
	agents, err := buildAgents(ctx, env.dir)
	if err != nil {
		return nil, fmt.Errorf("building the agents CLI: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	agentsCase := func(name, db string) cliCase {
		argv := func(owner string, wait bool, hold time.Duration, stamp string) []string {
			a := []string{agents, "--db", db, "--owner", owner, "locks", "run", "plan", "cli"}
			if wait {
				a = append(a, "--wait")
			}
			return append(a, "--", exe, hold.String(), stamp)
		}
		return cliCase{
			c:      &handoverCase{name: name, how: "`agents --db … locks run plan cli [--wait] -- CMD`"},
			holder: func(stamp string) []string { return argv("bench-cli-a", false, cliHold, stamp) },
			waiter: func(stamp string) []string { return argv("bench-cli-b", true, 0, stamp) },
		}
	}
	cli = append(cli, cliCase{
		c: &handoverCase{name: "exec alone", how: "from the bench's fork+exec of the stamping command to its stamp: a part of every figure below"},
		waiter: func(stamp string) []string {
			return []string{exe, "0s", stamp}
		},
	})
	if sqlite {
		db, err := store("cli", false)
		if err != nil {
			return nil, err
		}
		cli = append(cli, agentsCase("agents-sqlite", db))
		if flock, err := exec.LookPath("flock"); err != nil {
			h.skipped = append(h.skipped, "flock(1) skipped: "+err.Error())
		} else {
			file := env.file("flock1")
			argv := func(hold time.Duration, stamp string) []string {
				return []string{flock, file, exe, hold.String(), stamp}
			}
			cli = append(cli, cliCase{
				c:      &handoverCase{name: "flock(1)", how: "`flock FILE CMD`, for both"},
				holder: func(stamp string) []string { return argv(cliHold, stamp) },
				waiter: func(stamp string) []string { return argv(0, stamp) },
			})
		}
	}
	if pg {
		dsn, err := store("cli", true)
		if err != nil {
			return nil, err
		}
		cli = append(cli, agentsCase("agents-postgres", dsn))
	}
	stamps := filepath.Join(env.dir, "stamps")
	if err := os.MkdirAll(stamps, 0o700); err != nil {
		return nil, err
	}
	for i := -1; i < opts.cliHandovers; i++ {
		for k := range cli {
			c := cli[(k+max(i, 0))%len(cli)]
			if c.c.err != nil {
				continue
			}
			d, err := c.handOver(ctx, filepath.Join(stamps, fmt.Sprintf("%d-%d", i+1, k)))
			switch {
			case errors.Is(err, errNotBlocked):
				c.c.discarded++
			case err != nil:
				c.c.err = err
				fmt.Fprintf(env.log, "hand-over through the CLI, %s: %v\n", c.c.name, err)
			case i >= 0:
				c.c.latencies = append(c.c.latencies, d)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for _, c := range cli {
		slices.Sort(c.c.latencies)
		h.cli = append(h.cli, c.c)
	}

	// 7: fairness, one store after the other.
	for _, s := range []struct {
		name     string
		postgres bool
		on       bool
	}{{"module-sqlite", false, sqlite}, {"module-postgres", true, pg}} {
		if !s.on {
			continue
		}
		fmt.Fprintf(env.log, "fairness, %s: %d processes × %d waiters for %v\n", s.name, fairProcesses, fairWaiters, opts.fairFor)
		f := &fairResult{name: s.name}
		h.fair = append(h.fair, f)
		db, err := store("fair", s.postgres)
		if err != nil {
			return nil, err
		}
		reports, err := runWorkers(ctx, env, fairMode, db, fairProcesses, opts.fairFor)
		if err != nil {
			f.err = err
			continue
		}
		for _, r := range reports {
			f.grants = append(f.grants, r.Grants...)
			f.took = max(f.took, time.Duration(r.ElapsedNS))
		}
	}
	return h, nil
}

func isSelected(selected []contender, name string) bool {
	return slices.ContainsFunc(selected, func(c contender) bool { return c.name == name })
}

// pair is two hand-over workers of one implementation and the case they
// measure; holder is the one that holds the lock.
type pair struct {
	c      *handoverCase
	w      [2]*hoWorker
	holder int
}

// startPair starts two workers on target and has the first take the lock.
func startPair(ctx context.Context, env *environment, mode, target string) (*pair, error) {
	p := &pair{}
	for i := range p.w {
		w, err := startHoWorker(ctx, env, mode, target, strconv.Itoa(i))
		if err != nil {
			return p, err
		}
		p.w[i] = w
	}
	if err := p.w[0].send("take"); err != nil {
		return p, err
	}
	if _, err := p.w[0].expect("waiting"); err != nil {
		return p, err
	}
	_, err := p.w[0].expect("got")
	return p, err
}

// sample is one hand-over: its latency, and, where the waiter can tell,
// how long the try that took the lock lasted (-1: not known) and how
// many tries the waiter made, that one included.
type sample struct {
	latency, try time.Duration
	attempts     int64
}

// handOver has the waiter block, then the holder release; the roles swap.
func (p *pair) handOver(ctx context.Context) (sample, error) {
	waiter := p.w[1-p.holder]
	if err := waiter.send("take"); err != nil {
		return sample{}, err
	}
	before, err := waiter.expect("waiting")
	if err != nil {
		return sample{}, err
	}
	// Past its first try: the waiter sleeps until it is woken.
	if err := sleep(ctx, handoverPause); err != nil {
		return sample{}, err
	}
	s, err := p.handOverBlocked()
	s.attempts -= before[0]
	return s, err
}

func (p *pair) stop() {
	for _, w := range p.w {
		if w != nil {
			w.stop()
		}
	}
}

// idleWaiters blocks the waiter of every pair behind its holder for d,
// all at once, and returns what each waiter process spent meanwhile.
func idleWaiters(ctx context.Context, pairs []*pair, d time.Duration) []*idleResult {
	type blocked struct {
		p     *pair
		r     *idleResult
		t0    int64
		stats []int64
	}
	var all []*blocked
	for _, p := range pairs {
		if p.c.err != nil {
			continue
		}
		b := &blocked{p: p, r: &idleResult{name: p.c.name}}
		all = append(all, b)
		w := p.w[1-p.holder]
		if b.r.err = w.send("take"); b.r.err == nil {
			_, b.r.err = w.expect("waiting")
		}
	}
	_ = sleep(ctx, handoverPause) // past the first tries
	stats := func(b *blocked) []int64 {
		if b.r.err != nil {
			return nil
		}
		w := b.p.w[1-b.p.holder]
		var s []int64
		if b.r.err = w.send("stats"); b.r.err == nil {
			s, b.r.err = w.expect("stats")
		}
		return s
	}
	for _, b := range all {
		b.stats, b.t0 = stats(b), monoNow()
	}
	_ = sleep(ctx, d)
	var out []*idleResult
	for _, b := range all {
		t1, s := monoNow(), stats(b)
		if b.r.err == nil {
			b.r.blocked, b.r.cpu, b.r.reads = time.Duration(t1-b.t0), time.Duration(s[1]-b.stats[1]), s[0]-b.stats[0]
			if s[0] < 0 {
				b.r.reads = -1
			}
		}
		out = append(out, b.r)
	}
	for _, b := range all {
		if b.r.err == nil { // let the waiter have the lock, as a hand-over
			_, b.r.err = b.p.handOverBlocked()
		}
	}
	return out
}

// handOverBlocked finishes a hand-over whose waiter is already blocked.
// A waiter may have the lock before the holder's release has returned
// (the lock is free before the release's last steps, and on two CPUs the
// woken waiter may run first): that hand-over took no time after the
// release, and counts as zero. A waiter that had it before the release
// was even called is an error.
// The sample's attempts are the waiter's count so far, plus one.
func (p *pair) handOverBlocked() (sample, error) {
	holder, waiter := p.w[p.holder], p.w[1-p.holder]
	if err := holder.send("release"); err != nil {
		return sample{}, err
	}
	rel, err := holder.expect("released")
	if err != nil {
		return sample{}, err
	}
	got, err := waiter.expect("got")
	if err != nil {
		return sample{}, err
	}
	p.holder = 1 - p.holder
	if got[0] < rel[0] {
		return sample{}, fmt.Errorf("the waiter's acquire returned %v before the holder's release was called", time.Duration(rel[0]-got[0]))
	}
	return sample{latency: max(0, time.Duration(got[0]-rel[1])), try: time.Duration(got[2]), attempts: got[1] + 1}, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hoWorker is a hand-over worker process, spoken to line by line.
type hoWorker struct{ worker }

func startHoWorker(ctx context.Context, env *environment, mode, target, id string) (*hoWorker, error) {
	w, err := startWorker(ctx, env, mode, target, id)
	if err != nil {
		return nil, err
	}
	hw := &hoWorker{w}
	if _, err := hw.expect("ready"); err != nil {
		hw.stop()
		return nil, err
	}
	return hw, nil
}

func (w *hoWorker) send(line string) error {
	_, err := io.WriteString(w.stdin, line+"\n")
	return err
}

// expect reads the worker's next line, which must begin with word, and
// returns the numbers that follow it.
func (w *hoWorker) expect(word string) ([]int64, error) {
	line, err := w.out.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("worker: expected %q, read %q: %w", word, line, err)
	}
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != word {
		return nil, fmt.Errorf("worker: expected %q, read %q", word, strings.TrimSpace(line))
	}
	nums := make([]int64, len(f)-1)
	for i, s := range f[1:] {
		if nums[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, fmt.Errorf("worker: %q: %w", strings.TrimSpace(line), err)
		}
	}
	return nums, nil
}

// stop ends the worker: at the end of its input, or killed if it is
// still there a few seconds later (blocked in an acquire).
func (w *hoWorker) stop() {
	if w.cmd == nil {
		return
	}
	_ = w.stdin.Close()
	done := make(chan struct{})
	go func() { _ = w.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = w.cmd.Process.Kill()
		<-done
	}
	w.cmd = nil
}

// cliCase is a hand-over through commands: holder and waiter return the
// command lines that stamp into a path; without holder, the case is the
// waiter's command alone, measured from its start.
type cliCase struct {
	c              *handoverCase
	holder, waiter func(stamp string) []string
}

// errNotBlocked: the waiter was started too late to be blocked at the
// release; the run says nothing of the hand-over.
var errNotBlocked = errors.New("the waiter was started too close to the release")

// handOver starts the holder, waits until its command runs, starts the
// waiter, and returns the waiter's start stamp minus the holder's end
// stamp.
func (c cliCase) handOver(ctx context.Context, stamp string) (time.Duration, error) {
	a, b := stamp+"-a", stamp+"-b"
	start := func(argv []string) (*exec.Cmd, *bytes.Buffer, error) {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), workerEnv+"="+stampMode)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		return cmd, &out, cmd.Start()
	}
	finish := func(cmd *exec.Cmd, out *bytes.Buffer) error {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, oneLine(out.String()))
		}
		return nil
	}
	if c.holder == nil {
		t0 := monoNow()
		cmd, out, err := start(c.waiter(b))
		if err == nil {
			err = finish(cmd, out)
		}
		if err != nil {
			return 0, err
		}
		t, err := readStamp(b + ".start")
		return time.Duration(t - t0), err
	}
	hc, hout, err := start(c.holder(a))
	if err != nil {
		return 0, err
	}
	if err := waitForFile(ctx, a+".start", 10*time.Second); err != nil {
		_ = hc.Process.Kill()
		_ = hc.Wait()
		return 0, fmt.Errorf("the holder's command did not start: %w: %s", err, oneLine(hout.String()))
	}
	started := monoNow()
	wc, wout, werr := start(c.waiter(b))
	herr := finish(hc, hout)
	if werr == nil {
		werr = finish(wc, wout)
	}
	if err := errors.Join(herr, werr); err != nil {
		return 0, err
	}
	end, err := readStamp(a + ".end")
	if err != nil {
		return 0, err
	}
	got, err := readStamp(b + ".start")
	if err != nil {
		return 0, err
	}
	switch {
	case got < end:
		return 0, fmt.Errorf("the waiter's command started %v before the holder's ended", time.Duration(end-got))
	case time.Duration(end-started) < cliLead:
		return 0, errNotBlocked
	}
	return time.Duration(got - end), nil
}

func readStamp(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func waitForFile(ctx context.Context, path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return err
		}
		if err := sleep(ctx, 200*time.Microsecond); err != nil {
			return err
		}
	}
}

// buildAgents builds the agents CLI of the module under test into dir.
func buildAgents(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/cleveragents/locks").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/cleveragents/locks (run the bench from its module, bench/): %w", err)
	}
	bin := filepath.Join(dir, "agents")
	cmd := exec.CommandContext(ctx, "go", "build", "-C", strings.TrimSpace(string(out)), "-o", bin, "./cmd/agents")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: %s", err, out)
	}
	return bin, nil
}
