package hosts

import (
	"sort"
	"time"
)

// span is a stretch of real time.
type span struct{ from, to time.Time }

// stops holds each host's pauses, widened, merged and in order.
type stops map[string][]span

// pauses gathers the pauses among the faults, each widened by slack on
// both sides.
func pauses(faults []Event, slack time.Duration) stops {
	s := stops{}
	for _, f := range faults {
		if f.Fault == FaultPause {
			s[f.Host] = append(s[f.Host], span{f.At.Add(-slack), f.End.Add(slack)})
		}
	}
	for h, sp := range s {
		sort.Slice(sp, func(i, j int) bool { return sp[i].from.Before(sp[j].from) })
		merged := sp[:1]
		for _, x := range sp[1:] {
			if l := &merged[len(merged)-1]; !x.from.After(l.to) {
				if x.to.After(l.to) {
					l.to = x.to
				}
				continue
			}
			merged = append(merged, x)
		}
		s[h] = merged
	}
	return s
}

// running is how much of from..to host was not stopped: a pause excuses
// only the time around it, not the rest of a claim's life.
func (s stops) running(host string, from, to time.Time) time.Duration {
	if !to.After(from) {
		return 0
	}
	d := to.Sub(from)
	for _, p := range s[host] {
		lo, hi := p.from, p.to
		if lo.Before(from) {
			lo = from
		}
		if hi.After(to) {
			hi = to
		}
		if hi.After(lo) {
			d -= hi.Sub(lo)
		}
	}
	return d
}
