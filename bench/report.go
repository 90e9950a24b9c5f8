package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// report is everything one run measured, and renders it as Markdown.
type report struct {
	opts       options
	machine    machine
	started    time.Time
	took       time.Duration
	loadBefore string
	loadAfter  string
	scenarios  []scenarioResult
	processes  []*procResult
	sizes      scenarioResult
	cleanup    *cleanupResult
	skipped    []string
	chart      string // relative link to the chart, if one was drawn
	// handover is the hand-over part, nil when it did not run.
	handover      *handoverReport
	handoverChart string
	loss          *lossReport // the prompt-loss part, nil when it did not run
}

// text renders the run: how it was made, the tables and the ratios.
func (r *report) text() string {
	var b strings.Builder
	o := r.opts
	r.writeHeader(&b, r.skipped, "cycles per second by contender and scenario", r.chart)
	r.writeHeadline(&b)
	r.writeGoals(&b)
	fmt.Fprintf(&b, "### Callers in one process\n\n%s of %v per contender and scenario, interleaved, after a warm-up. "+
		"Each cell: the p50, p99 and worst cycle in ms over every cycle of every round, and the range of the rounds' cycles/s.\n\n",
		plural(o.rounds, "round"), o.roundFor)
	r.writeLatencies(&b)
	if len(r.processes) > 0 {
		fmt.Fprintf(&b, "\n### %d processes on one SQLite file\n\n%s of %v each, alternating; one caller per process, "+
			"cycling resources of its own. Fairness is the slowest process's cycles ÷ the fastest's (median of the rounds; worst round in brackets).\n\n",
			o.processes, plural(o.procRounds, "round"), o.procFor)
		b.WriteString("| contender | cycles/s, all processes | fairness | p99 | worst | failed operations (retried) |\n|---|---:|---:|---:|---:|---:|\n")
		for _, p := range r.processes {
			fmt.Fprintf(&b, "| %s | %s | %.2f [%.2f] | %s | %s | %d |\n", p.contender, rate(median(p.rates)),
				median(p.fairness), minOf(p.fairness), ms(quantile(p.latencies, 0.99)), ms(worst(p.latencies)), p.errors)
		}
	}
	if len(r.sizes.results) > 0 {
		fmt.Fprintf(&b, "\n### Table size\n\nThe module's cycle, one caller, on a file pre-filled with unexpired locks of other resources; "+
			"%s of %v, interleaved.\n\n", plural(o.rounds, "round"), o.roundFor)
		b.WriteString("| scenario | contender | cycles/s | p50 | p99 | worst |\n|---|---|---:|---:|---:|---:|\n")
		for _, res := range r.sizes.results {
			writeResultRow(&b, r.sizes.scenario.name, res)
		}
	}
	if c := r.cleanup; c != nil {
		fmt.Fprintf(&b, "\n### Cleanup of %s expired locks\n\n`Locks.CleanupExpired` purges them (%s, a fresh file each) while one caller "+
			"cycles a resource of its own; then the caller cycles alone on the same file for as long again.\n\n", count(c.rows), plural(len(c.purges), "round"))
		b.WriteString("| the caller's cycles | cycles | p50 | p99 | worst |\n|---|---:|---:|---:|---:|\n")
		fmt.Fprintf(&b, "| during the purge | %d | %s | %s | %s |\n", len(c.during), ms(quantile(c.during, 0.5)), ms(quantile(c.during, 0.99)), ms(worst(c.during)))
		fmt.Fprintf(&b, "| alone, afterwards | %d | %s | %s | %s |\n", len(c.idle), ms(quantile(c.idle, 0.5)), ms(quantile(c.idle, 0.99)), ms(worst(c.idle)))
		var purges []string
		for _, p := range c.purges {
			purges = append(purges, p.Round(10*time.Millisecond).String())
		}
		fmt.Fprintf(&b, "\nThe purge took %s.\n", strings.Join(purges, ", "))
	}
	return b.String()
}

// writeHeader says how the run was made and where, what it skipped, and
// links the section's chart (alt, at chart; none if empty).
func (r *report) writeHeader(b *strings.Builder, skipped []string, alt, chart string) {
	fmt.Fprintf(b, "Command: `%s`, started %s, took %v.\n\n", strings.TrimSpace(r.opts.command), r.started.UTC().Format("2006-01-02 15:04 MST"), r.took.Round(time.Second))
	fmt.Fprintf(b, "Machine: %s. Load average (1, 5, 15 min): %s before the run, %s after.\n\n", r.machine, r.loadBefore, r.loadAfter)
	for _, s := range skipped {
		fmt.Fprintf(b, "- %s\n", s)
	}
	if len(skipped) > 0 {
		b.WriteString("\n")
	}
	if chart != "" {
		fmt.Fprintf(b, "![%s](%s)\n\n", alt, chart)
	}
}

// writeLatencies is one row per contender, one column per scenario.
func (r *report) writeLatencies(b *strings.Builder) {
	b.WriteString("| contender |")
	for _, s := range r.scenarios {
		fmt.Fprintf(b, " %s |", s.scenario.name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(r.scenarios)) + "\n")
	for _, name := range contenderNames() {
		var cells []string
		ran := false
		for _, s := range r.scenarios {
			var res *result
			for _, x := range s.results {
				if x.contender == name {
					res = x
				}
			}
			switch {
			case res == nil:
				cells = append(cells, "")
				continue
			case res.err != nil:
				cells = append(cells, "failed: "+oneLine(res.err.Error()))
			default:
				l := res.latencies
				cells = append(cells, fmt.Sprintf("%s / %s / %s [%s–%s]", msn(quantile(l, 0.5)), msn(quantile(l, 0.99)), msn(worst(l)),
					rate(minOf(res.rates)), rate(slices.Max(res.rates))))
			}
			ran = true
		}
		if ran {
			fmt.Fprintf(b, "| %s | %s |\n", name, strings.Join(cells, " | "))
		}
	}
}

func writeResultRow(b *strings.Builder, scenario string, res *result) {
	if res.err != nil {
		fmt.Fprintf(b, "| %s | %s | failed: %s | | | |\n", scenario, res.contender, oneLine(res.err.Error()))
		return
	}
	fmt.Fprintf(b, "| %s | %s | %s [%s–%s] | %s | %s | %s |\n", scenario, res.contender,
		rate(median(res.rates)), rate(minOf(res.rates)), rate(slices.Max(res.rates)),
		ms(quantile(res.latencies, 0.5)), ms(quantile(res.latencies, 0.99)), ms(worst(res.latencies)))
}

// ratio is the median over rounds of a's cycles/s ÷ b's in the same
// round: contenders that ran in the same round saw the same machine.
func ratio(a, b *result) (float64, bool) {
	if a == nil || b == nil || len(a.rates) == 0 || len(a.rates) != len(b.rates) {
		return 0, false
	}
	rs := make([]float64, len(a.rates))
	for i := range rs {
		rs[i] = a.rates[i] / b.rates[i]
	}
	return median(rs), true
}

func (r *report) scenario(name string) scenarioResult {
	for _, s := range r.scenarios {
		if s.scenario.name == name {
			return s
		}
	}
	return scenarioResult{}
}

// floors names the floor each contender is compared with in the headline.
var floors = map[string]string{"module-sqlite": "floor-sqlite", "module-postgres": "floor-postgres"}

// writeHeadline is one row per contender, one column per scenario: the
// median cycles/s, and for the module its ratio to the floor of its
// database (the median over rounds of the ratio within a round).
func (r *report) writeHeadline(b *strings.Builder) {
	b.WriteString("### Headline\n\nCycles per second (median of the rounds); for the module, × its floor on the same database.\n\n| contender |")
	for _, s := range r.scenarios {
		fmt.Fprintf(b, " %s |", s.scenario.name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(r.scenarios)) + "\n")
	for _, name := range contenderNames() {
		var cells []string
		any := false
		for _, s := range r.scenarios {
			res := s.find(name)
			if res == nil {
				cells = append(cells, "")
				continue
			}
			any = true
			cell := rate(median(res.rates))
			if v, ok := ratio(res, s.find(floors[name])); ok {
				cell += " (" + times(v) + ")"
			}
			cells = append(cells, cell)
		}
		if any {
			fmt.Fprintf(b, "| %s | %s |\n", name, strings.Join(cells, " | "))
		}
	}
	b.WriteString("\n")
}

// writeGoals lists each ratio against its goal. PostgreSQL's are what a
// 2-core machine that runs the server, the client and the kernel gives.
func (r *report) writeGoals(b *strings.Builder) {
	b.WriteString("### Against the goals\n\nRatios of cycles per second are the median over rounds of the ratio within a round.\n\n")
	b.WriteString("| measure | measured | goal | |\n|---|---:|---:|---|\n")
	row := goalRow(b)
	for _, g := range []struct {
		scenario string
		goal     float64
	}{{"1 caller", 0.9}, {"8 callers", 2.0}, {"32 callers", 4.0}, {"8 on one resource", 1.0}} {
		s := r.scenario(g.scenario)
		v, ok := ratio(s.find("module-sqlite"), s.find("floor-sqlite"))
		row("module-sqlite ÷ floor-sqlite, "+g.scenario, times(v), ok, fmt.Sprintf("≥ %.1f", g.goal), v >= g.goal)
	}
	s := r.scenario("32 callers")
	v, ok := ratio(s.find("module-sqlite"), s.find("redislock"))
	row("module-sqlite ÷ redislock, 32 callers", times(v), ok, "≥ 1.0", v >= 1)
	for _, g := range []struct {
		scenario string
		goal     float64
	}{{"1 caller", 0.9}, {"8 callers", 1.5}, {"32 callers", 3.5}, {"128 callers", 6.0}} {
		s := r.scenario(g.scenario)
		v, ok := ratio(s.find("module-postgres"), s.find("floor-postgres"))
		row("module-postgres ÷ floor-postgres, "+g.scenario, times(v), ok, fmt.Sprintf("≥ %.1f", g.goal), v >= g.goal)
	}
	v, ok = ratio(s.find("module-postgres"), s.find("pg-advisory"))
	row("module-postgres ÷ pg-advisory, 32 callers", times(v), ok, "≥ 0.5", v >= 0.5)
	var mod *procResult
	for _, p := range r.processes {
		if p.contender == "module-sqlite" {
			mod = p
		}
	}
	n := r.opts.processes
	if mod != nil && len(mod.fairness) > 0 {
		f := minOf(mod.fairness)
		row(fmt.Sprintf("%d processes, module: fairness (worst round)", n), fmt.Sprintf("%.2f", f), true, "≥ 0.80", f >= 0.8)
		w := worst(mod.latencies)
		row(fmt.Sprintf("%d processes, module: worst cycle", n), ms(w), true, "≤ 50 ms", w <= 50*time.Millisecond)
	} else {
		row(fmt.Sprintf("%d processes, module", n), "", false, "fairness ≥ 0.80, worst ≤ 50 ms", false)
	}
	if c := r.cleanup; c != nil {
		w := worst(c.during)
		row(fmt.Sprintf("cleanup of %s rows: the acquirer's worst cycle", count(c.rows)), ms(w), true, "≤ 25 ms", w <= 25*time.Millisecond)
	} else {
		row("cleanup: the acquirer's worst cycle", "", false, "≤ 25 ms", false)
	}
	b.WriteString("\n")
}

func minOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Min(xs)
}

// times renders a ratio.
func times(v float64) string { return fmt.Sprintf("%.2f×", v) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ms renders a latency in milliseconds, with precision where it is short.
func ms(d time.Duration) string {
	switch v := msf(d); {
	case v < 1:
		return fmt.Sprintf("%.2f ms", v)
	case v < 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.0f ms", v)
	}
}

// msn is ms without its unit, for cells whose header gives it.
func msn(d time.Duration) string { return strings.TrimSuffix(ms(d), " ms") }

// rate renders cycles per second with thousands separators.
func rate(v float64) string { return count(int(v + 0.5)) }

// count renders n with thousands separators: 1,000,000.
func count(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// plural says "1 round", "3 rounds".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", "/")
}

func sortDurations(ds ...[]time.Duration) {
	for _, d := range ds {
		slices.Sort(d)
	}
}
