package hosts

import "time"

// checkEstimates holds each host's estimate of the server's time to the
// uncertainty it stated with it (docs/operations.md): the real time it was
// read between, widened by that uncertainty and the slack. One violation
// a host, its worst.
func checkEstimates(sorted []Event, lim Limits, add func(kind, format string, args ...any)) {
	type worst struct {
		e   Event
		off time.Duration
		n   int
	}
	hosts := map[string]*worst{}
	for _, e := range sorted {
		if e.Estimate.IsZero() {
			continue
		}
		var off time.Duration // how far past its bound, signed as the estimate's error
		if lo := e.EstimateFrom.Add(-e.Uncertainty - lim.EstimateSlack); e.Estimate.Before(lo) {
			off = e.Estimate.Sub(e.EstimateFrom)
		} else if hi := e.EstimateTo.Add(e.Uncertainty + lim.EstimateSlack); e.Estimate.After(hi) {
			off = e.Estimate.Sub(e.EstimateTo)
		} else {
			continue
		}
		w := hosts[e.Host]
		if w == nil {
			w = &worst{}
			hosts[e.Host] = w
		}
		if w.n++; off.Abs() > w.off.Abs() {
			w.e, w.off = e, off
		}
	}
	for h, w := range hosts {
		add(VEstimate, "%s (%s): its estimate of the server's time was off by %v at %s, beyond the %v it stated (%d events so)",
			h, w.e.Owner, w.off, stamp(w.e.EstimateFrom), w.e.Uncertainty, w.n)
	}
}
