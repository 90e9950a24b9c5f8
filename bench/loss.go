package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Prompt loss: how soon a holder in `Do`, in another process, learns that
// its lock was removed or taken over behind its back, through the store's
// wake-ups rather than at its next renewal (TTL/2 later). The measuring
// code is Linux-only (loss_linux.go), as the hand-over's: it reads
// CLOCK_MONOTONIC in each process.

// Modes of -loss: run the case with the hand-over part, skip it, or run
// it alone.
const (
	lossOn   = "on"
	lossOff  = "off"
	lossOnly = "only"
)

const (
	// lossTTL is the holder's: its renewal would find the loss
	// lossTTL/2 late, so a figure far below that is the wake-up's.
	lossTTL = 20 * time.Second
	// lossBound is how soon after the takeover the holder's work must
	// have ended (issue 39).
	lossBound = 200 * time.Millisecond
)

// lossMode is the worker mode of the holder.
const lossMode = "loss-holder"

// mainRuns reports whether the main section's cases run.
func (o options) mainRuns() bool { return o.handover != handoverOnly && o.loss != lossOnly }

// handoverRuns reports whether the hand-over cases run.
func (o options) handoverRuns() bool { return o.handover != handoverOff && o.loss != lossOnly }

// lossRuns reports whether the prompt-loss cases run: alone, or with the
// hand-over cases (an unset mode, as in the tests' profiles, is off).
func (o options) lossRuns() bool {
	return o.loss == lossOnly || (o.loss == lossOn && o.handover != handoverOff)
}

// lossCase is one way of ending a holding behind the holder's back, on one
// store: its delays, and the reasons the holder was given.
type lossCase struct {
	c       *handoverCase // its latencies are the delays, sorted at the end
	store   string        // the contender whose store it is: module-sqlite or module-postgres
	reasons map[string]int
}

// lossReport is everything the prompt-loss part measured.
type lossReport struct {
	cases   []*lossCase
	skipped []string
}

// The prompt-loss section lies between markers of its own.
const (
	lossBegin = "<!-- bench:loss:begin -->"
	lossEnd   = "<!-- bench:loss:end -->"
)

// lossText renders the prompt-loss section.
func (r *report) lossText() string {
	l := r.loss
	var b strings.Builder
	r.writeHeader(&b, l.skipped, "", "")
	b.WriteString("### Prompt loss against its goals\n\n| measure | measured | goal | |\n|---|---:|---:|---|\n")
	row := goalRow(&b)
	for _, lc := range l.cases {
		c := lc.c
		ok := c.err == nil && len(c.latencies) > 0
		p99 := quantile(c.latencies, 0.99)
		row(c.name+": loss heard, p99", ms(p99), ok, "≤ "+ms(lossBound), p99 <= lossBound)
	}
	fmt.Fprintf(&b, "\n### A holder's loss, heard in another process\n\n"+
		"A worker process holds a fresh resource in `Do` with a TTL of %v (its renewal, at TTL/2, would find a loss %v late); "+
		"once the bench sees (through the store's wake-ups) that the holder watches the resource, it ends the holding from its own process, "+
		"and the delay runs from the moment the call that ended it returned to the moment the holder's work context ended, "+
		"each read on CLOCK_MONOTONIC in its own process. A holder that learned before that call returned counts as zero. "+
		"%d rounds per case after one for warming up, the cases interleaved.\n\n", lossTTL, lossTTL/2, r.opts.handovers)
	cases := make([]*handoverCase, len(l.cases))
	for i, lc := range l.cases {
		cases[i] = lc.c
	}
	writeCaseTable(&b, cases, false)
	b.WriteString("\n| case | the holder's `LockLostError` reasons |\n|---|---|\n")
	for _, lc := range l.cases {
		if lc.c.err != nil || len(lc.reasons) == 0 {
			continue
		}
		var rs []string
		for _, reason := range slices.Sorted(maps.Keys(lc.reasons)) {
			rs = append(rs, fmt.Sprintf("%s: %d", reason, lc.reasons[reason]))
		}
		fmt.Fprintf(&b, "| %s | %s |\n", lc.c.name, strings.Join(rs, ", "))
	}
	return b.String()
}
