package hosts

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// VNoEffect is the violation of a fault that, seen from outside, did not
// take effect: a run whose faults did nothing proves nothing, however
// clean its history.
const VNoEffect = "fault-without-effect"

// KindClock: right after the harness stepped its clock, the host read its
// injected wall clock (Clock) at the real time At.
const KindClock = "clock"

// FaultSeen is one fault as the harness saw it from outside while it
// lasted: what ProveFaults holds it to.
type FaultSeen struct {
	Kind string
	Host string // "" for every host (a server restart)
	// At and End are the fault's, as its KindFault event has them.
	At, End time.Time
	// In is when the fault was certainly in place: the command, signal or
	// toxic that injects it had returned. Out is when the harness began
	// to undo it: until then it was still in place.
	In, Out time.Time
	// RoundTrip is a latency fault's probe: the first answer, through the
	// host's proxy, to a request sent while the toxic was in place; zero
	// with ProbeErr when none answered.
	RoundTrip time.Duration
	ProbeErr  string
	// A reset's probe is RoundTrip and ProbeErr too: one request through
	// the host's proxy while the toxic was in place, which must not be
	// answered but reset (ProbeErr says "reset" or "EOF").
	//
	// ServerStart is a server restart's: the server's own start time
	// (pg_postmaster_start_time()), read once it was back; ServerErr why
	// it could not be read.
	ServerStart time.Time
	ServerErr   string
	// Left names a killed host's processes that were not gone (zombies
	// count as gone) within ProofLimits.Gone of the signal; empty: none.
	Left string
	// Offset is the offset from the real time that a clock step set on
	// the host's clock: what the host must read after it.
	Offset time.Duration
}

// Commit is a transaction of a host's process, as the server recorded it:
// a row of the writes table, or a grant or renewal in lock_changes (never
// a deletion, which another host's takeover or purge makes of this
// owner's row). Began is the server's now() in it, when its transaction
// began; At its clock_timestamp() at the change, before its commit.
type Commit struct {
	Owner string
	What  string // what it was, for the message: "write h1-1-4", "grant plan/p1 token 5"
	Began time.Time
	At    time.Time
}

// ProofLimits are the margins ProveFaults allows a loaded machine.
type ProofLimits struct {
	// Settle is how long after a cut-off was in place a transaction of
	// its host may still begin on the server: a statement already on its
	// way through the proxy and the server's queue. A transaction that
	// began before the cut-off may commit under it (a statement that
	// waited on another's lock): only those that began after Settle count.
	Settle time.Duration
	// MinRoundTrip is the shortest round trip the latency toxic allows
	// (its latency less its jitter, each way), less a little: a probe
	// faster than this did not go through it.
	MinRoundTrip time.Duration
	// ClockRead is how soon after a step its host must report reading
	// its clock; ClockSlack how far from the step's offset it may read.
	ClockRead, ClockSlack time.Duration
}

// ProveFaults holds each fault to its effect, seen from outside the host:
//   - a partition, a pause or a blackhole: no transaction of the host's
//     processes that the server began after Settle past the fault's In
//     committed (its change dated) before its Out, by the server's own
//     records and clock;
//   - a latency: a probe through the host's proxy took MinRoundTrip;
//   - a reset: a probe through the host's proxy was reset, not answered;
//   - a server restart: the server's start time after the restart began;
//   - a kill: none of the host's processes was left;
//   - a clock step: the host read its clock, within ClockRead of the
//     step, at the step's offset within ClockSlack.
//
// events gives each owner's host; one violation per fault, in the order
// of the faults.
func ProveFaults(seen []FaultSeen, events []Event, commits []Commit, lim ProofLimits) []Violation {
	hostOf := hostsOf(events)
	sorted := append([]Commit(nil), commits...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].At.Before(sorted[j].At) })
	var out []Violation
	for _, f := range seen {
		on := f.Host
		if on == "" {
			on = "the server"
		}
		name := fmt.Sprintf("%s of %s from %s to %s", f.Kind, on, stamp(f.At), stamp(f.End))
		fail := func(format string, args ...any) {
			out = append(out, Violation{Kind: VNoEffect, Detail: name + ": " + fmt.Sprintf(format, args...)})
		}
		switch f.Kind {
		case FaultPartition, FaultPause, FaultBlackhole:
			from := f.In.Add(lim.Settle)
			var inside []Commit
			for _, c := range sorted {
				if hostOf[c.Owner] == f.Host && !c.Began.Before(from) && !c.At.After(f.Out) {
					inside = append(inside, c)
				}
			}
			if len(inside) > 0 {
				c := inside[0]
				fail("the host committed %d transactions that the server began from %s (%v after it was in place) to %s, the first %s of %s, begun at %s and changed at %s (server time)",
					len(inside), stamp(from), lim.Settle, stamp(f.Out), c.What, c.Owner, stamp(c.Began), stamp(c.At))
			}
		case FaultLatency:
			switch {
			case f.RoundTrip == 0:
				fail("no probe through the host's proxy was answered while it lasted (%s)", f.ProbeErr)
			case f.RoundTrip < lim.MinRoundTrip:
				fail("a probe through the host's proxy was answered in %v, under the %v the toxic allows", f.RoundTrip.Round(time.Microsecond), lim.MinRoundTrip)
			}
		case FaultReset:
			switch {
			case f.RoundTrip > 0:
				fail("a probe through the host's proxy was answered in %v: its connections were not reset", f.RoundTrip.Round(time.Microsecond))
			case !strings.Contains(f.ProbeErr, "reset") && !strings.Contains(f.ProbeErr, "EOF"):
				fail("a probe through the host's proxy was not answered, but not reset either: %s", f.ProbeErr)
			}
		case FaultRestart:
			switch {
			case f.ServerStart.IsZero():
				fail("the server's start time could not be read after it: %s", f.ServerErr)
			case f.ServerStart.Before(f.At):
				fail("the server's start time read after it was %s: it had not restarted", stamp(f.ServerStart))
			}
		case FaultKill:
			if f.Left != "" {
				fail("the host's processes were not gone after SIGKILL: %s", f.Left)
			}
		case FaultClock:
			var read *Event
			for i := range events {
				e := &events[i]
				if e.Kind == KindClock && e.Host == f.Host && !e.At.Before(f.At) && !e.At.After(f.At.Add(lim.ClockRead)) &&
					(read == nil || e.At.Before(read.At)) {
					read = e
				}
			}
			switch {
			case read == nil:
				fail("the host reported no reading of its clock within %v of the step to %v", lim.ClockRead, f.Offset)
			case (read.Clock.Sub(read.At) - f.Offset).Abs() > lim.ClockSlack:
				fail("the host's clock read %s at %s, %v from the real time, not the %v stepped to", read.Clock.UTC().Format(time.RFC3339Nano),
					stamp(read.At), read.Clock.Sub(read.At).Round(time.Millisecond), f.Offset)
			}
		}
	}
	return out
}

// hostsOf maps each owner to its host, from the events.
func hostsOf(events []Event) map[string]string {
	hostOf := map[string]string{}
	for _, e := range events {
		if e.Owner != "" && e.Host != "" {
			hostOf[e.Owner] = e.Host
		}
	}
	return hostOf
}
