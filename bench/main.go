// Command bench measures the lock module under concurrency against
// hand-written floors and other lock implementations, in one interleaved
// run, and writes the figures into docs/performance.md:
//
//	cd bench && go run . -out ../docs/performance.md
//
// It is a module of its own so that the clients of Redis and PostgreSQL
// that it compares with never become dependencies of the lock module.
// -quick runs a shorter version (about a minute); -contenders picks a
// subset; -builds compares checkouts of the module instead (see -h). Contenders whose server is unreachable are skipped with a
// message.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"
)

// options say what to run and how long; profiles fill them.
type options struct {
	rounds        int           // interleaved rounds of each scenario
	roundFor      time.Duration // one contender's share of a round
	procRounds    int           // rounds of the multi-process case
	procFor       time.Duration // one multi-process round
	processes     int           // worker processes on one file
	rows          [2]int        // table sizes compared: small, large
	expired       int           // backlog of expired rows purged
	cleanupRounds int
	contenders    []string // names to run; empty: all
	postgresDSN   string
	redisAddr     string
	out           string        // document to rewrite; empty: stdout only
	svg           string        // chart; empty: beside out
	command       string        // how the run was started, for the document
	handover      string        // handoverOn, handoverOff or handoverOnly
	loss          string        // lossOn, lossOff or lossOnly; empty: off
	handovers     int           // hand-overs per case between worker processes
	cliHandovers  int           // hand-overs per case through the CLI
	idleFor       time.Duration // how long the idle waiters wait
	fairFor       time.Duration // how long the fairness case cycles
}

// profiles are the run lengths -quick chooses between; tiny is for the
// smoke test.
var (
	fullRun = options{rounds: 7, roundFor: time.Second, procRounds: 2, procFor: 8 * time.Second, processes: 4,
		rows: [2]int{1_000, 1_000_000}, expired: 500_000, cleanupRounds: 2,
		handovers: 200, cliHandovers: 30, idleFor: 60 * time.Second, fairFor: 60 * time.Second}
	quickRun = options{rounds: 3, roundFor: 250 * time.Millisecond, procRounds: 1, procFor: 2 * time.Second, processes: 4,
		rows: [2]int{1_000, 50_000}, expired: 50_000, cleanupRounds: 1,
		handovers: 50, cliHandovers: 10, idleFor: 10 * time.Second, fairFor: 10 * time.Second}
	tinyRun = options{rounds: 1, roundFor: 50 * time.Millisecond, procRounds: 1, procFor: 300 * time.Millisecond, processes: 2,
		rows: [2]int{100, 1_000}, expired: 2_000, cleanupRounds: 1,
		handovers: 5, cliHandovers: 3, idleFor: time.Second, fairFor: time.Second}
)

func main() {
	if mode := os.Getenv(workerEnv); mode != "" {
		os.Exit(workerMain(mode, os.Stdin, os.Stdout))
	}
	quick := flag.Bool("quick", false, "short rounds and fewer rows: about a minute")
	out := flag.String("out", "", "rewrite the marked section of this Markdown file (docs/performance.md)")
	svg := flag.String("svg", "", "write the chart here (default: performance-concurrency.svg beside -out)")
	only := flag.String("contenders", "", "comma-separated contenders to run (default: all): "+strings.Join(contenderNames(), ","))
	pg := flag.String("postgres", envOr("LOCKS_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"PostgreSQL DSN (default from LOCKS_TEST_POSTGRES_DSN)")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	handover := flag.String("handover", handoverOn, "hand-over between processes: "+
		handoverOn+" (with the rest), "+handoverOff+", or "+handoverOnly+" (the rest is skipped and its section of -out left as it is)")
	loss := flag.String("loss", lossOn, "prompt loss (a holder's loss heard in another process): "+
		lossOn+" (with the hand-over cases, "+fmt.Sprint(fullRun.handovers)+" rounds per case, as many as hand-overs), "+lossOff+", or "+lossOnly+" (the rest is skipped and its sections of -out left as they are)")
	fifo := flag.Int("fifo", 0, "run only the order of waiters across processes (4 processes × 2 waiters), this many rounds on\n"+
		"SQLite and PostgreSQL, and print its table (docs/performance.md, \"Order of waiters\", is written by hand)")
	builds := flag.String("builds", "", "compare builds instead: name=dir,name=dir (checkouts of the lock module, e.g.\n"+
		"git worktree add --detach /tmp/c57 c57c013; go run . -builds c57c013=/tmp/c57,new=.. [-quick]):\n"+
		"each build's acquire+release cycle against its database/sql floor at 1, 8 and 32 callers on SQLite,\n"+
		"builds alternating in every round; prints cycles/s and the ratio to the floor per build")
	flag.Parse()

	opts := fullRun
	if *quick {
		opts = quickRun
	}
	opts.out, opts.svg, opts.postgresDSN, opts.redisAddr, opts.handover = *out, *svg, *pg, *redisAddr, *handover
	if h := opts.handover; h != handoverOn && h != handoverOff && h != handoverOnly {
		fmt.Fprintf(os.Stderr, "bench: -handover is %s, %s or %s, not %q\n", handoverOn, handoverOff, handoverOnly, h)
		os.Exit(2)
	}
	if opts.loss = *loss; opts.loss != lossOn && opts.loss != lossOff && opts.loss != lossOnly {
		fmt.Fprintf(os.Stderr, "bench: -loss is %s, %s or %s, not %q\n", lossOn, lossOff, lossOnly, opts.loss)
		os.Exit(2)
	}
	if *only != "" {
		opts.contenders = strings.Split(*only, ",")
	}
	opts.command = "cd bench && go run . " + strings.Join(os.Args[1:], " ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *fifo > 0 {
		if err := fifoOnly(ctx, opts, *fifo, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *builds != "" {
		if err := compareBuilds(ctx, *builds, opts.rounds, opts.roundFor, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, opts, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run measures every case that opts selects, prints the tables to stdout,
// says what it skipped and why on log, and rewrites opts.out if set.
func run(ctx context.Context, opts options, stdout, log io.Writer) error {
	dir, err := os.MkdirTemp("", "locks-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// Workers' stderr is copied to log from goroutines of their own.
	log = &lockedWriter{w: log}
	env := &environment{dir: dir, postgresDSN: opts.postgresDSN, redisAddr: opts.redisAddr, log: log}
	selected, err := selectContenders(ctx, env, opts.contenders)
	if err != nil {
		return err
	}
	defer env.close()

	r := &report{opts: opts, machine: describeMachine(ctx, env, selected), started: time.Now()}
	r.loadBefore = loadAverage()
	if opts.mainRuns() {
		if err := runConcurrency(ctx, env, selected, opts, r); err != nil {
			return err
		}
	}
	if opts.handoverRuns() {
		fmt.Fprintf(log, "hand-over between processes: %d per case, %d through the CLI; idle waiters %v, fairness %v\n",
			opts.handovers, opts.cliHandovers, opts.idleFor, opts.fairFor)
		if r.handover, err = runHandover(ctx, env, selected, opts); err != nil {
			return fmt.Errorf("hand-over: %w", err)
		}
	}
	if opts.lossRuns() {
		fmt.Fprintf(log, "prompt loss: %d rounds per case\n", opts.handovers)
		if r.loss, err = runLoss(ctx, env, selected, opts); err != nil {
			return fmt.Errorf("prompt loss: %w", err)
		}
	}
	r.loadAfter = loadAverage()
	r.took = time.Since(r.started)

	r.skipped = env.skipped
	if opts.mainRuns() {
		fmt.Fprint(stdout, r.text())
	}
	if r.handover != nil {
		fmt.Fprint(stdout, "\n## Hand-over between processes\n\n", r.handoverText())
	}
	if r.loss != nil {
		fmt.Fprint(stdout, "\n## Prompt loss\n\n", r.lossText())
	}
	if opts.out == "" {
		return nil
	}
	return r.write(opts.out, opts.svg)
}

// runConcurrency runs the cases of the main section: the scenarios in
// one process, several processes on one file, table size and cleanup.
func runConcurrency(ctx context.Context, env *environment, selected []contender, opts options, r *report) error {
	var err error
	for _, sc := range scenarios {
		fmt.Fprintf(env.log, "scenario %s: %d rounds of %v per contender\n", sc.name, opts.rounds, opts.roundFor)
		res, err := runScenario(ctx, env, sc, selected, opts)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", sc.name, err)
		}
		r.scenarios = append(r.scenarios, res)
	}
	if wants(opts.contenders, "module-sqlite") || wants(opts.contenders, "floor-sqlite") {
		fmt.Fprintf(env.log, "%d processes on one file: %d rounds of %v\n", opts.processes, opts.procRounds, opts.procFor)
		if r.processes, err = runProcesses(ctx, env, opts); err != nil {
			return fmt.Errorf("%d processes: %w", opts.processes, err)
		}
	}
	if wants(opts.contenders, "module-sqlite") {
		fmt.Fprintf(env.log, "table size: %d against %d rows\n", opts.rows[0], opts.rows[1])
		if r.sizes, err = runTableSizes(ctx, env, opts); err != nil {
			return fmt.Errorf("table size: %w", err)
		}
		fmt.Fprintf(env.log, "cleanup of %d expired rows, %d rounds\n", opts.expired, opts.cleanupRounds)
		if r.cleanup, err = runCleanup(ctx, env, opts); err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
	}
	return nil
}

// wants reports whether name is among the selected contenders (all when
// none is named).
func wants(selected []string, name string) bool {
	if len(selected) == 0 {
		return true
	}
	for _, s := range selected {
		if strings.TrimSpace(s) == name {
			return true
		}
	}
	return false
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// fifoOnly runs the order of waiters across processes alone (-fifo).
func fifoOnly(ctx context.Context, opts options, rounds int, stdout, log io.Writer) error {
	dir, err := os.MkdirTemp("", "locks-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	env := &environment{dir: dir, postgresDSN: opts.postgresDSN, redisAddr: opts.redisAddr, log: &lockedWriter{w: log}}
	defer env.close()
	return runFIFO(ctx, env, rounds, stdout)
}
