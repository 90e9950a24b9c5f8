package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// scenario is a number of callers, on resources of their own or on one
// they all share.
type scenario struct {
	name    string
	callers int
	shared  bool
}

var scenarios = []scenario{
	{name: "1 caller", callers: 1},
	{name: "8 callers", callers: 8},
	{name: "32 callers", callers: 32},
	{name: "128 callers", callers: 128},
	{name: "8 on one resource", callers: 8, shared: true},
}

// result is what one contender did in one scenario, over all rounds.
type result struct {
	contender string
	rates     []float64       // cycles per second, one per round
	latencies []time.Duration // every cycle of every round, sorted at the end
	err       error           // why the contender stopped, if it did
}

// scenarioResult holds the results of one scenario, in contender order.
type scenarioResult struct {
	scenario scenario
	results  []*result
}

// find returns the result of the named contender, or nil.
func (s scenarioResult) find(name string) *result {
	for _, r := range s.results {
		if r.contender == name && r.err == nil && len(r.rates) > 0 {
			return r
		}
	}
	return nil
}

// runScenario opens every contender afresh, warms each up, and then runs
// opts.rounds rounds in which each contender runs for opts.roundFor in
// turn; the order rotates from round to round, so that the noise of the
// machine (other jobs, checkpoints of the disk's cache) falls on every
// contender alike. A contender that fails is reported with its error and
// left out of the remaining rounds.
func runScenario(ctx context.Context, env *environment, sc scenario, cs []contender, opts options) (scenarioResult, error) {
	type running struct {
		inst    instance
		callers []cycleFunc
		res     *result
	}
	runs := make([]*running, len(cs))
	defer func() {
		for _, r := range runs {
			if r != nil && r.inst != nil {
				if err := r.inst.close(); err != nil {
					fmt.Fprintf(env.log, "closing %s: %v\n", r.res.contender, err)
				}
			}
		}
	}()
	out := scenarioResult{scenario: sc}
	for i, c := range cs {
		r := &running{res: &result{contender: c.name}}
		runs[i] = r
		out.results = append(out.results, r.res)
		if r.inst, r.res.err = c.open(ctx, env); r.res.err != nil {
			continue
		}
		r.callers, r.res.err = r.inst.callers(ctx, sc.callers, sc.shared)
	}
	warmUp := min(opts.roundFor, 200*time.Millisecond)
	for round := -1; round < opts.rounds; round++ {
		for k := range runs {
			r := runs[(k+max(round, 0))%len(runs)]
			if r.res.err != nil {
				continue
			}
			if round < 0 { // warm-up: connections, prepared statements, caches
				_, _, r.res.err = runRound(ctx, r.callers, warmUp)
				continue
			}
			rate, lat, err := runRound(ctx, r.callers, opts.roundFor)
			if err != nil {
				r.res.err = err
				fmt.Fprintf(env.log, "%s, %s: %v\n", sc.name, r.res.contender, err)
				continue
			}
			r.res.rates = append(r.res.rates, rate)
			r.res.latencies = append(r.res.latencies, lat...)
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
	}
	for _, r := range runs {
		slices.Sort(r.res.latencies)
	}
	return out, nil
}

// runRound starts every caller at once, lets them cycle for d, and waits
// for the cycles in progress to finish. It returns the cycles per second
// (completed cycles over the time until the last caller stopped) and the
// time each cycle took.
func runRound(ctx context.Context, callers []cycleFunc, d time.Duration) (float64, []time.Duration, error) {
	start := time.Now()
	lat, err := runWhile(ctx, callers, func() {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return float64(len(lat)) / time.Since(start).Seconds(), lat, nil
}

// runWhile starts every caller at once, cycling until during returns (or
// a cycle fails, or ctx ends), then waits for the cycles in progress to
// finish, and returns how long each cycle took.
func runWhile(ctx context.Context, callers []cycleFunc, during func()) ([]time.Duration, error) {
	var (
		stop    atomic.Bool
		wg      sync.WaitGroup
		mu      sync.Mutex
		all     []time.Duration
		errs    []error
		release = make(chan struct{})
	)
	for _, cycle := range callers {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1024)
			<-release
			for !stop.Load() && ctx.Err() == nil {
				t0 := time.Now()
				if err := cycle(ctx); err != nil {
					stop.Store(true)
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					break
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	close(release)
	during()
	stop.Store(true)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return all, ctx.Err()
}

// median of xs; zero for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// quantile of sorted durations: the smallest value at or above the q-th
// fraction of them.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(len(sorted)-1, i))]
}

// worst is the longest of sorted durations.
func worst(sorted []time.Duration) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[len(sorted)-1]
}
