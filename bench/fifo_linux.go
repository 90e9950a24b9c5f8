//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The order of waiters across processes (issue 39): fifoProcesses worker
// processes run fifoPerProcess waiters each on one resource that the bench
// holds; the waiters begin to wait fifoGap apart, taking turns between the
// processes, and once the bench releases, each takes the lock and releases
// it at once. A round is in order when they were granted in the order they
// began to wait; a hand-over runs from the moment the release of the one
// before it returned (the first: the bench's) to the moment the waiter's
// Take returned, CLOCK_MONOTONIC, zero if the waiter had the lock first,
// as in the 2-process hand-over case.
const (
	fifoMode       = "handover-fifo"
	fifoProcesses  = 4
	fifoPerProcess = 2
	fifoGap        = 50 * time.Millisecond
)

var fifoRef = domain.ResourceRef{Type: domain.ResourcePlan, ID: "fifo"}

// fifoResult is the fifo case on one store.
type fifoResult struct {
	store     string
	rounds    int
	inOrder   int
	orders    [][]int // the grant order of every round, by the order of waiting
	handovers []time.Duration
	err       error
}

// runFIFO runs rounds of the fifo case on SQLite and, if it answers,
// PostgreSQL, and prints a table of the results on stdout.
func runFIFO(ctx context.Context, env *environment, rounds int, stdout io.Writer) error {
	var results []fifoResult
	path := env.file("fifo")
	if err := createSchema(ctx, path); err != nil {
		return err
	}
	results = append(results, fifoStore(ctx, env, "SQLite", path, rounds))
	if err := pingPostgres(ctx, env.postgresDSN); err != nil {
		fmt.Fprintln(env.log, "fifo: PostgreSQL skipped:", err)
	} else {
		dsn, err := newSchema(ctx, env, "fifo")
		if err == nil {
			err = createSchema(ctx, dsn)
		}
		if err != nil {
			return err
		}
		results = append(results, fifoStore(ctx, env, "PostgreSQL", dsn, rounds))
	}
	fmt.Fprint(stdout, fifoText(results))
	return nil
}

// fifoText is the Markdown table of results.
func fifoText(results []fifoResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d processes × %d waiters, beginning to wait %v apart, one resource:\n\n", fifoProcesses, fifoPerProcess, fifoGap)
	b.WriteString("| store | rounds in arrival order | hand-overs | p50 | p90 | p99 | worst | grant orders (first rounds) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		if r.err != nil {
			fmt.Fprintf(&b, "| %s | failed: %v | | | | | | |\n", r.store, r.err)
			continue
		}
		h := r.handovers
		var shown []string
		for _, o := range r.orders[:min(3, len(r.orders))] {
			shown = append(shown, fmt.Sprint(o))
		}
		fmt.Fprintf(&b, "| %s | %d of %d | %d | %s | %s | %s | %s | %s |\n", r.store, r.inOrder, r.rounds, len(h),
			ms(quantile(h, 0.5)), ms(quantile(h, 0.9)), ms(quantile(h, 0.99)), ms(worst(h)), strings.Join(shown, " "))
	}
	return b.String()
}

// fifoStore runs rounds on the store at target.
func fifoStore(ctx context.Context, env *environment, name, target string, rounds int) fifoResult {
	r := fifoResult{store: name}
	fail := func(err error) fifoResult {
		r.err = err
		fmt.Fprintf(env.log, "fifo, %s: %v\n", name, err)
		return r
	}
	holder, err := locks.Open(ctx, locks.Config{Database: target, Owner: "bench-fifo-holder"})
	if err != nil {
		return fail(err)
	}
	defer holder.Close()
	var ws []*hoWorker
	defer func() {
		for _, w := range ws {
			w.stop()
		}
	}()
	for i := range fifoProcesses {
		w, err := startHoWorker(ctx, env, fifoMode, target, strconv.Itoa(i))
		if err != nil {
			return fail(err)
		}
		ws = append(ws, w)
	}
	n := fifoProcesses * fifoPerProcess
	for range rounds {
		h, err := holder.Locks.Take(ctx, "bench-fifo-holder", fifoRef, application.AcquireOptions{TTL: lockTTL})
		if err != nil {
			return fail(err)
		}
		for i := range n { // waiter i runs in process i % fifoProcesses
			w := ws[i%fifoProcesses]
			if err := w.send("wait " + strconv.Itoa(i)); err != nil {
				return fail(err)
			}
			if _, err := w.expect("waiting"); err != nil {
				return fail(err)
			}
			if err := sleep(ctx, fifoGap); err != nil {
				return fail(err)
			}
		}
		if err := released(h.Release(ctx)); err != nil {
			return fail(err)
		}
		freed := monoNow()
		type grant struct{ waiter, at, release int64 }
		var grants []grant
		for p, w := range ws {
			for range fifoPerProcess {
				v, err := w.expect("got")
				if err != nil {
					return fail(fmt.Errorf("process %d: %w", p, err))
				}
				grants = append(grants, grant{v[0], v[1], v[2]})
			}
		}
		slices.SortFunc(grants, func(a, b grant) int { return int(a.at - b.at) })
		order := make([]int, n)
		ok := true
		for k, g := range grants {
			order[k] = int(g.waiter)
			ok = ok && int(g.waiter) == k
			before := freed
			if k > 0 {
				before = grants[k-1].release
			}
			r.handovers = append(r.handovers, time.Duration(max(0, g.at-before)))
		}
		r.rounds++
		r.orders = append(r.orders, order)
		if ok {
			r.inOrder++
		}
	}
	slices.Sort(r.handovers)
	return r
}

// fifoMain is a fifo worker: "wait <i>" answers "waiting <i>", and starts
// waiter i, which once granted releases at once and answers "got <i>
// <granted> <released>": CLOCK_MONOTONIC ns as its Take and its Release returned.
func fifoMain(database, id string, stdin io.Reader, stdout io.Writer) int {
	ctx := context.Background()
	owner := "bench-fifo-" + id
	c, err := locks.Open(ctx, locks.Config{Database: database, Owner: owner})
	if err != nil {
		fmt.Fprintln(stdout, "error open:", oneLine(err.Error()))
		return 1
	}
	defer c.Close()
	warm := domain.ResourceRef{Type: domain.ResourcePlan, ID: "warm-" + id}
	if h, err := c.Locks.Take(ctx, owner, warm, application.AcquireOptions{Wait: true, TTL: lockTTL}); err == nil {
		_, _ = h.Release(ctx)
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stdout, format+"\n", args...)
	}
	say("ready")
	var wg sync.WaitGroup
	defer wg.Wait()
	in := bufio.NewScanner(stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 2 || f[0] != "wait" {
			say("error unknown command %q", in.Text())
			continue
		}
		say("waiting %s", f[1])
		wg.Add(1)
		go func(i string) {
			defer wg.Done()
			h, err := c.Locks.Take(ctx, owner, fifoRef, application.AcquireOptions{Wait: true, TTL: lockTTL})
			at := monoNow()
			if err != nil {
				say("error take: %s", oneLine(err.Error()))
				return
			}
			if err := released(h.Release(ctx)); err != nil {
				say("error release: %s", oneLine(err.Error()))
				return
			}
			rel := monoNow()
			say("got %s %d %d", i, at, rel)
		}(f[1])
	}
	return 0
}
