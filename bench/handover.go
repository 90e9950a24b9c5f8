package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The hand-over between processes: how long a lock released in
// one process takes to reach a waiter blocked in another, against the
// kernel's and the server's own queues (flock, pg_advisory_lock), through
// the module and through the agents CLI; what a blocked waiter costs
// while it waits; and how evenly waiters of several processes are served.
// The measuring code is Linux-only (handover_linux.go): it reads
// CLOCK_MONOTONIC in each process and locks files with flock(2).

// Modes of -handover: run the hand-over cases with the others, skip
// them, or run them alone.
const (
	handoverOn   = "on"
	handoverOff  = "off"
	handoverOnly = "only"
)

// handoverCase is one way of handing a lock over and its latencies.
type handoverCase struct {
	name      string
	how       string
	latencies []time.Duration // sorted at the end
	tries     []time.Duration // the module's: how long the try that took the lock lasted, sorted
	wakes     []time.Duration // the module's: latency − that try, sorted: until the waiter was woken and tried
	attempts  []int64         // the module's: tries per hand-over, the one that took it included
	discarded int             // CLI runs whose waiter was not started well before the release
	err       error
}

// idleResult is what a waiter blocked behind a live holder cost.
type idleResult struct {
	name    string
	blocked time.Duration
	cpu     time.Duration // the waiter process's user+system time meanwhile
	reads   int64         // its acquire attempts meanwhile; -1: not counted
	err     error
}

// fairResult is how grants were shared among waiters of several
// processes cycling one resource.
type fairResult struct {
	name   string
	grants []int // per waiter, process by process
	took   time.Duration
	err    error
}

// handoverReport is everything the hand-over part measured.
type handoverReport struct {
	processes []*handoverCase
	cli       []*handoverCase
	idle      []*idleResult
	fair      []*fairResult
	skipped   []string
}

func (h *handoverReport) find(cases []*handoverCase, name string) *handoverCase {
	for _, c := range cases {
		if c.name == name && c.err == nil && len(c.latencies) > 0 {
			return c
		}
	}
	return nil
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// handoverText renders the hand-over section.
func (r *report) handoverText() string {
	h, o := r.handover, r.opts
	var b strings.Builder
	r.writeHeader(&b, h.skipped, "hand-over latency by case", r.handoverChart)
	r.writeHandoverGoals(&b)

	fmt.Fprintf(&b, "### Hand-over latency\n\nTwo worker processes take turns on one resource (%d hand-overs per case after one for warming up, "+
		"the cases interleaved): the waiter reports that it is about to block, the holder releases %v later, and the latency runs from the moment "+
		"the holder's release returned to the moment the waiter's acquire returned, each read in its own process on CLOCK_MONOTONIC "+
		"(`clock_gettime`), which all processes of a machine share. A waiter that had the lock before the holder's release returned "+
		"(the lock is free before the release's last steps, and the woken waiter may run first) counts as zero. "+
		"For the module, the waiter also reports (from its `acquired` and `refused` events) how long the try that took the lock lasted "+
		"and how many tries it made: the rest of the latency is the time until it was woken and started that try.\n\n", o.handovers, handoverPause)
	writeCaseTable(&b, h.processes, false)
	b.WriteString("\n| case | the try that took the lock: p50 | p99 | latency − that try: p50 | p99 | tries per hand-over (mean) |\n|---|---:|---:|---:|---:|---:|\n")
	for _, c := range h.processes {
		if c.err != nil || len(c.tries) == 0 {
			continue
		}
		var tries int64
		for _, a := range c.attempts {
			tries += a
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f |\n", c.name, ms(quantile(c.tries, 0.5)), ms(quantile(c.tries, 0.99)),
			ms(quantile(c.wakes, 0.5)), ms(quantile(c.wakes, 0.99)), float64(tries)/float64(len(c.attempts)))
	}
	fmt.Fprintf(&b, "\n### Through the CLI\n\n%d hand-overs per case, interleaved, after one for warming up. The holder runs a command that "+
		"sleeps %v and then stamps the time; the waiter, started while the holder's command sleeps, runs one that stamps the time as it starts; "+
		"the latency is the waiter's stamp minus the holder's. The command is the bench binary itself, for both. "+
		"A run whose waiter was started less than %v before the holder's stamp is discarded (it may not have been blocked yet).\n\n",
		o.cliHandovers, cliHold, cliLead)
	writeCaseTable(&b, h.cli, true)

	if len(h.idle) > 0 {
		fmt.Fprintf(&b, "\n### A waiter blocked behind a live holder\n\nEach waiter process waits %v behind a holder in another process "+
			"(all cases at once); its CPU time is getrusage(RUSAGE_SELF) of the waiter process, user and system, over that time. "+
			"Acquire attempts are the module's `refused` events (each a try against the store: a write transaction on SQLite, "+
			"one statement on PostgreSQL); flock and pg_advisory_lock wait in the kernel's or the server's queue, without attempts to count.\n\n", o.idleFor)
		b.WriteString("| case | blocked for | CPU time | CPU per second blocked | acquire attempts | attempts/s |\n|---|---:|---:|---:|---:|---:|\n")
		for _, x := range h.idle {
			if x.err != nil {
				fmt.Fprintf(&b, "| %s | failed: %s | | | | |\n", x.name, oneLine(x.err.Error()))
				continue
			}
			reads, rate := "not counted", ""
			if x.reads >= 0 {
				reads, rate = fmt.Sprint(x.reads), fmt.Sprintf("%.2f", float64(x.reads)/x.blocked.Seconds())
			}
			fmt.Fprintf(&b, "| %s | %v | %s | %.3f ms/s | %s | %s |\n", x.name, x.blocked.Round(10*time.Millisecond), ms(x.cpu),
				msf(x.cpu)/x.blocked.Seconds(), reads, rate)
		}
	}
	if len(h.fair) > 0 {
		fmt.Fprintf(&b, "\n### Fairness\n\n%d processes × %d waiters (goroutines, each its own owner) cycle one resource for %v: "+
			"`Take` with `Wait`, hold %v, `Handle.Release`, again. The fair share is the total ÷ %d.\n\n",
			fairProcesses, fairWaiters, o.fairFor, fairHold, fairProcesses*fairWaiters)
		b.WriteString("| store | grants | per waiter | min | max | min ÷ fair share |\n|---|---:|---|---:|---:|---:|\n")
		for _, f := range h.fair {
			if f.err != nil {
				fmt.Fprintf(&b, "| %s | failed: %s | | | | |\n", f.name, oneLine(f.err.Error()))
				continue
			}
			total, lo, hi, share := fairness(f.grants)
			per := make([]string, len(f.grants))
			for i, g := range f.grants {
				per[i] = fmt.Sprint(g)
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %.2f |\n", f.name, total, strings.Join(per, ", "), lo, hi, share)
		}
	}
	return b.String()
}

// fairness returns the total of grants, their least and most, and the
// least as a fraction of the fair share.
func fairness(grants []int) (total, lo, hi int, share float64) {
	if len(grants) == 0 {
		return 0, 0, 0, 0
	}
	for _, g := range grants {
		total += g
	}
	lo, hi = slices.Min(grants), slices.Max(grants)
	if total > 0 {
		share = float64(lo) / (float64(total) / float64(len(grants)))
	}
	return total, lo, hi, share
}

func writeCaseTable(b *strings.Builder, cases []*handoverCase, discarded bool) {
	b.WriteString("| case | how | n | p50 | p99 | worst | mean |")
	if discarded {
		b.WriteString(" discarded |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
	} else {
		b.WriteString("\n|---|---|---:|---:|---:|---:|---:|\n")
	}
	for _, c := range cases {
		end := " |\n"
		if discarded {
			end = fmt.Sprintf(" | %d |\n", c.discarded)
		}
		if c.err != nil {
			fmt.Fprintf(b, "| %s | %s | failed: %s | | | | |%s", c.name, c.how, oneLine(c.err.Error()), strings.TrimSuffix(end, " |\n")+"\n")
			continue
		}
		l := c.latencies
		fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s | %s%s", c.name, c.how, len(l),
			ms(quantile(l, 0.5)), ms(quantile(l, 0.99)), ms(worst(l)), ms(mean(l)), end)
	}
}

// writeHandoverGoals lists the hand-over's goals against the figures.
func (r *report) writeHandoverGoals(b *strings.Builder) {
	h := r.handover
	b.WriteString("### Hand-over against its goals\n\n| measure | measured | goal | |\n|---|---:|---:|---|\n")
	row := goalRow(b)
	for _, g := range []struct {
		name     string
		p50, p99 time.Duration
	}{{"module-sqlite", 2 * time.Millisecond, 20 * time.Millisecond}, {"module-postgres", 5 * time.Millisecond, 25 * time.Millisecond}} {
		c := h.find(h.processes, g.name)
		var p50, p99 time.Duration
		if c != nil {
			p50, p99 = quantile(c.latencies, 0.5), quantile(c.latencies, 0.99)
		}
		row(g.name+": hand-over p50", ms(p50), c != nil, "≤ "+ms(g.p50), p50 <= g.p50)
		row(g.name+": hand-over p99", ms(p99), c != nil, "≤ "+ms(g.p99), p99 <= g.p99)
	}
	ref := h.find(h.cli, "flock(1)")
	for _, name := range []string{"agents-sqlite", "agents-postgres"} {
		c := h.find(h.cli, name)
		var v float64
		if c != nil && ref != nil {
			v = float64(quantile(c.latencies, 0.5)) / float64(quantile(ref.latencies, 0.5))
		}
		row(name+": CLI median ÷ flock(1)'s", times(v), c != nil && ref != nil, "≤ 2.0", v <= 2)
	}
	for _, name := range []string{"module-sqlite", "module-postgres"} {
		var f *fairResult
		for _, x := range h.fair {
			if x.name == name && x.err == nil {
				f = x
			}
		}
		var share float64
		if f != nil {
			_, _, _, share = fairness(f.grants)
		}
		row(fmt.Sprintf("%s: fairness, least-served waiter ÷ fair share", name), fmt.Sprintf("%.2f", share), f != nil, "≥ 0.50", share >= 0.5)
	}
	b.WriteString("\n")
}

// goalRow returns a writer of rows of a goals table.
func goalRow(b *strings.Builder) func(what, measured string, ok bool, goal string, met bool) {
	return func(what, measured string, ok bool, goal string, met bool) {
		switch {
		case !ok:
			fmt.Fprintf(b, "| %s | not measured | %s | |\n", what, goal)
		case met:
			fmt.Fprintf(b, "| %s | %s | %s | met |\n", what, measured, goal)
		default:
			fmt.Fprintf(b, "| %s | %s | %s | **not met** |\n", what, measured, goal)
		}
	}
}

// The shape of the cases, shared by the measuring code and the report.
const (
	handoverPause = 20 * time.Millisecond  // the waiter's head start before the release
	cliHold       = 200 * time.Millisecond // the CLI holder's command
	cliLead       = 100 * time.Millisecond
	fairProcesses = 4
	fairWaiters   = 2
	fairHold      = time.Millisecond
)

// Worker modes of the hand-over part, besides "handover-<implementation>".
const (
	stampMode = "stamp" // the command the CLI cases run
	fairMode  = "fair-module"
)
