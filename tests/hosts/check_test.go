package hosts

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	t0         = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	testLimits = Limits{LossBound: time.Second, Recovery: 10 * time.Second, PauseSlack: time.Second, EventSlack: 50 * time.Millisecond}
)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// clean is a history with no violation: h1 holds plan/p1 (token 1) for
// 2 s, renews it, writes and releases; h2 takes it (token 2) after, writes;
// h1 is partitioned from 10 s to 14 s and commits again at 16 s.
func clean() ([]Event, Tables) {
	ev := []Event{
		{Kind: KindAcquired, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(0), Expires: at(2)},
		{Kind: KindRenewed, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(1), Expires: at(3)},
		{Kind: KindBelief, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(1.5)},
		{Kind: KindWrite, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(1.6), Outcome: Committed, Attempt: "a1"},
		{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(1.7)},
		{Kind: KindAcquired, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(1.8), Expires: at(3.8), Stored: at(1.79)},
		{Kind: KindBelief, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(2)},
		{Kind: KindWrite, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(2.1), Outcome: Committed, Attempt: "a2"},
		{Kind: KindFault, Host: "h1", Fault: FaultPartition, At: at(10), End: at(14)},
		{Kind: KindAcquired, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(15), Expires: at(17)},
		{Kind: KindWrite, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(16), Outcome: Committed, Attempt: "a3"},
		{Kind: KindWrite, Host: "h2", Owner: "h2-1", Resource: "log/r1", Token: 9, At: at(16), Outcome: Refused, Attempt: "a4"},
	}
	tables := Tables{
		Rows: []Row{
			{ID: 1, Kind: "transition", Resource: "plan/p1", Token: 1, Owner: "h1-1", Attempt: "a1", At: at(1.55)},
			{ID: 2, Kind: "transition", Resource: "plan/p1", Token: 2, Owner: "h2-1", Attempt: "a2", At: at(2.05)},
			{ID: 3, Kind: "do", Resource: "log/r1", Token: 3, Owner: "h1-1", Attempt: "a3", At: at(15.9)},
		},
		Counters: map[string]int64{"plan/p1": 2},
	}
	return ev, tables
}

func TestCheck_CleanHistory(t *testing.T) {
	ev, tables := clean()
	assert.Empty(t, Check(ev, tables, at(30), testLimits))
}

// Each case plants one violation in the clean history; the checker must
// report it, and only that kind.
func TestCheck_FindsEachViolation(t *testing.T) {
	cases := []struct {
		name  string
		kind  string
		plant func(ev []Event, tb *Tables) []Event
	}{
		{"OverlappingHolders", VOverlap, func(ev []Event, tb *Tables) []Event {
			// h1 still believed it held token 1 after h2 took token 2.
			return append(ev, Event{Kind: KindBelief, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(1.9)})
		}},
		{"EarlyTakeover", VEarlyTakeover, func(ev []Event, tb *Tables) []Event {
			// h1 never released token 1, renewed to 3 s at 1 s, and was
			// still at work (its write ended at 1.9 s): h2 was granted
			// token 2 at 1.79 s on the server's clock.
			return unreleased(ev)
		}},
		{"EarlyTakeoverOfARenewalCommittedBefore", VEarlyTakeover, func(ev []Event, tb *Tables) []Event {
			// The renewal recorded just before the grant began counts; one
			// recorded after it may have committed after the decision.
			ev = slices.DeleteFunc(unreleased(ev), func(e Event) bool { return e.Kind == KindRenewed })
			return append(ev,
				Event{Kind: KindRenewed, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(1.7), Expires: at(3.7)},
				Event{Kind: KindRenewed, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(1.78), Expires: at(9)})
		}},
		{"WriteAfterTakeover", VStaleWrite, func(ev []Event, tb *Tables) []Event {
			// A write with token 1 ran after token 2 was acquired: the
			// fence checked the owner, not the token.
			tb.Rows[0].At = at(1.9)
			return ev
		}},
		{"CounterNotTransitions", VCounter, func(ev []Event, tb *Tables) []Event {
			tb.Counters["plan/p1"] = 3
			return ev
		}},
		{"TokensNotIncreasing", VTokenOrder, func(ev []Event, tb *Tables) []Event {
			tb.Rows = append(tb.Rows, Row{ID: 5, Kind: "do", Resource: "log/r1", Token: 3, Owner: "h1-1", Attempt: "a6", At: at(15.95)})
			return ev
		}},
		{"TokenOfTwoOwners", VTokenOrder, func(ev []Event, tb *Tables) []Event {
			return append(ev, Event{Kind: KindAcquired, Host: "h3", Owner: "h3-1", Resource: "log/r1", Token: 3, At: at(20), Expires: at(22)})
		}},
		{"LossLearnedLate", VLateLoss, func(ev []Event, tb *Tables) []Event {
			// Expiry at 3.8, told at 5.8: one TTL late.
			return append(ev, Event{Kind: KindLost, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(5.8)})
		}},
		{"BeliefPastExpiry", VLateLoss, func(ev []Event, tb *Tables) []Event {
			return append(ev, Event{Kind: KindBelief, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(5.5)})
		}},
		{"RefusedButWritten", VRefusedWrote, func(ev []Event, tb *Tables) []Event {
			tb.Rows = append(tb.Rows, Row{ID: 6, Kind: "do", Resource: "log/r2", Token: 9, Owner: "h2-1", Attempt: "a4", At: at(16)})
			return ev
		}},
		{"CommittedButAbsent", VLostWrite, func(ev []Event, tb *Tables) []Event {
			tb.Rows = tb.Rows[:2]
			return ev
		}},
		{"NoRecovery", VNoRecovery, func(ev []Event, tb *Tables) []Event {
			// h2 is cut off at 20 s for 2 s and never commits again.
			return append(ev, Event{Kind: KindFault, Host: "h2", Fault: FaultPartition, At: at(20), End: at(22)})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev, tables := clean()
			ev = tc.plant(ev, &tables)
			got := Check(ev, tables, at(40), testLimits)
			require.NotEmpty(t, got, "the checker missed the planted %s", tc.kind)
			for _, v := range got {
				assert.Equal(t, tc.kind, v.Kind, v.Detail)
			}
			t.Log(got)
		})
	}
}

// A stopped process cannot learn of anything: its claims are exempt from
// the overlap and loss rules, and a fault followed by another on the same
// host, or by the end of the run, asks for no recovery in between.
// unreleased is the clean history where h1 did not release token 1 and
// was still writing (its write ended at 1.9 s) when h2 took token 2.
func unreleased(ev []Event) []Event {
	ev = slices.DeleteFunc(slices.Clone(ev), func(e Event) bool { return e.Kind == KindReleased })
	for i := range ev {
		if ev[i].Attempt == "a1" {
			ev[i].At = at(1.9)
		}
	}
	return ev
}

// A lock granted once its holder's work was done (its last write) may have
// been released with an answer that never reached the holder.
func TestCheck_ReleaseWhoseAnswerWasLost(t *testing.T) {
	ev, tables := clean()
	ev = slices.DeleteFunc(ev, func(e Event) bool { return e.Kind == KindReleased })
	assert.Empty(t, Check(ev, tables, at(30), testLimits))
}

func TestCheck_Exemptions(t *testing.T) {
	ev, tables := clean()
	ev = append(ev,
		Event{Kind: KindFault, Host: "h1", Fault: FaultPause, At: at(1.2), End: at(6)},
		Event{Kind: KindBelief, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(6.1)},
		Event{Kind: KindFault, Host: "h2", Fault: FaultLatency, At: at(20), End: at(22)},
		Event{Kind: KindFault, Host: "h2", Fault: FaultKill, At: at(25), End: at(25.1)},
		Event{Kind: KindFault, Host: "h2", Fault: FaultBlackhole, At: at(30), End: at(38)},
	)
	assert.Empty(t, Check(ev, tables, at(40), testLimits))
}
