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

// withChanges is the clean history's tables with the server's log of the
// locks table: token 1 granted, renewed, released; token 2 granted after
// the release, in a transaction of its own; token 3 granted.
func withChanges(tb Tables) Tables {
	tb.Changes = []Change{
		{ID: 1, Op: ChangeGrant, Resource: "plan/p1", Token: 1, Owner: "h1-1", Acquired: at(0), Expires: at(2), Tx: 1, At: at(-0.01)},
		{ID: 2, Op: ChangeExtend, Resource: "plan/p1", Token: 1, Owner: "h1-1", Expires: at(3), Tx: 2, At: at(0.99)},
		{ID: 3, Op: ChangeDelete, Resource: "plan/p1", Token: 1, Owner: "h1-1", Expires: at(3), Tx: 3, At: at(1.69)},
		{ID: 4, Op: ChangeGrant, Resource: "plan/p1", Token: 2, Owner: "h2-1", Acquired: at(1.8), Expires: at(3.8), Tx: 4, At: at(1.795)},
		{ID: 5, Op: ChangeGrant, Resource: "log/r1", Token: 3, Owner: "h1-1", Acquired: at(15), Expires: at(17), Tx: 5, At: at(14.99)},
	}
	return tb
}

func TestCheck_CleanHistoryWithTheServersLog(t *testing.T) {
	ev, tables := clean()
	// h2's estimate of the server's time, 40 µs behind, within its 50 µs.
	ev[5].Estimate, ev[5].EstimateFrom, ev[5].EstimateTo = at(1.8).Add(-40*time.Microsecond), at(1.8), at(1.8).Add(time.Microsecond)
	ev[5].Uncertainty = 50 * time.Microsecond
	assert.Empty(t, Check(ev, withChanges(tables), at(30), testLimits))
}

// Each case is a history that the checker once accepted although it breaks
// a promise; the checker must report it, with the kinds named and no
// other.
func TestCheck_Gaps(t *testing.T) {
	cases := []struct {
		name    string
		kinds   []string
		history func() ([]Event, Tables)
	}{
		{"WriteAfterItsOwnRelease", []string{VWriteReleased}, func() ([]Event, Tables) {
			// h1 released token 3 at 16.5 s; its write with token 3 landed
			// at 16.6 s. No newer token follows to show it.
			ev, tb := clean()
			ev = slices.DeleteFunc(ev, func(e Event) bool { return e.Attempt == "a3" })
			ev = append(ev,
				Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(16.5)},
				Event{Kind: KindWrite, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(16.65), Outcome: Committed, Attempt: "a3"})
			tb.Rows[2].At = at(16.6)
			return ev, tb
		}},
		{"WriteAfterItsOwnDeletionOnTheServer", []string{VWriteReleased}, func() ([]Event, Tables) {
			// The release's answer never reached h1: only the server's log
			// says token 3 was gone at 16.2 s.
			ev, tb := clean()
			tb = withChanges(tb)
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeDelete, Resource: "log/r1", Token: 3, Owner: "h1-1", Expires: at(17), Tx: 6, At: at(16.2)})
			tb.Rows[2].At = at(16.6)
			return ev, tb
		}},
		{"StaleWriteBeforeTheTakerRecordedIt", []string{VStaleWrite}, func() ([]Event, Tables) {
			// Token 1 expired at 2 s; h2 took it over at 2.1 s on the
			// server, and heard so at 2.4 s (latency). h1's write with
			// token 1 landed in between, at 2.2 s.
			ev := []Event{
				{Kind: KindAcquired, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(0), Expires: at(2), Stored: at(-0.01)},
				{Kind: KindLost, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(2)},
				{Kind: KindWrite, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(2.25), Outcome: Committed, Attempt: "a1"},
				{Kind: KindAcquired, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(2.4), Expires: at(4.1), Stored: at(2.09)},
				{Kind: KindBelief, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(2.45)},
				{Kind: KindWrite, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(2.55), Outcome: Committed, Attempt: "a2"},
			}
			tb := Tables{
				Rows: []Row{
					{ID: 1, Kind: "transition", Resource: "plan/p1", Token: 1, Owner: "h1-1", Attempt: "a1", At: at(2.2)},
					{ID: 2, Kind: "transition", Resource: "plan/p1", Token: 2, Owner: "h2-1", Attempt: "a2", At: at(2.5)},
				},
				Counters: map[string]int64{"plan/p1": 2},
				Changes: []Change{
					{ID: 1, Op: ChangeGrant, Resource: "plan/p1", Token: 1, Owner: "h1-1", Expires: at(2), Tx: 1, At: at(-0.01)},
					{ID: 2, Op: ChangeDelete, Resource: "plan/p1", Token: 1, Owner: "h1-1", Expires: at(2), Tx: 2, At: at(2.1)},
					{ID: 3, Op: ChangeGrant, Resource: "plan/p1", Token: 2, Owner: "h2-1", Expires: at(4.1), Tx: 2, At: at(2.1)},
				},
			}
			return ev, tb
		}},
		{"ReleaseRecordedLongAfterAnEarlyGrant", []string{VEarlyTakeover}, func() ([]Event, Tables) {
			// h1 was still at work (its write ended at 1.9 s) when h2 was
			// granted token 2 at 1.79 s; h1's release of token 1 is
			// recorded at 5 s, long after: it cannot excuse the grant.
			ev, tb := clean()
			ev = unreleased(ev)
			return append(ev, Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(5)}), tb
		}},
		{"EarlyGrantOnTheServersLog", []string{VEarlyTakeover}, func() ([]Event, Tables) {
			// The same, as the server logged it: token 1, good until 3 s,
			// deleted by the transaction that granted token 2 at 1.795 s.
			ev, tb := clean()
			ev = unreleased(ev)
			ev = append(ev, Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(5)})
			tb = withChanges(tb)
			tb.Changes[2].Tx, tb.Changes[2].At = 4, at(1.795)
			return ev, tb
		}},
		{"PauseExemptsOnlyAroundIt", []string{VOverlap, VLateLoss}, func() ([]Event, Tables) {
			// h1 was stopped from 1.2 s to 3 s, then ran on believing it
			// held token 1 at 6.1 s, 2 s after its pause (and slack) ended.
			ev, tb := clean()
			return append(ev,
				Event{Kind: KindFault, Host: "h1", Fault: FaultPause, At: at(1.2), End: at(3)},
				Event{Kind: KindBelief, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(6.1)}), tb
		}},
		{"LossLearnedLongAfterAPause", []string{VLateLoss}, func() ([]Event, Tables) {
			// Token 1 expired at 3 s during h1's pause (1.2 s to 3 s); it
			// learned of the loss at 5.5 s, 1.5 s of running after the
			// pause and its slack.
			ev, tb := clean()
			return append(ev,
				Event{Kind: KindFault, Host: "h1", Fault: FaultPause, At: at(1.2), End: at(3)},
				Event{Kind: KindLost, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(5.5)}), tb
		}},
		{"HoldersThatNeverWrite", []string{VOverlap}, func() ([]Event, Tables) {
			// Neither holder writes. h1 still held project/x at 2.5 s
			// (a mark of its own, not a write's); h2 was granted it at
			// 2.1 s, as the server logged, and died before it could say
			// so.
			ev := []Event{
				{Kind: KindAcquired, Host: "h1", Owner: "h1-1", Resource: "project/x", Token: 1, At: at(0), Expires: at(2), Stored: at(-0.01)},
				{Kind: KindBelief, Host: "h1", Owner: "h1-1", Resource: "project/x", Token: 1, At: at(1.5)},
				{Kind: KindBelief, Host: "h1", Owner: "h1-1", Resource: "project/x", Token: 1, At: at(2.5)},
				{Kind: KindStarted, Host: "h2", Owner: "h2-1", At: at(0)},
			}
			tb := Tables{Changes: []Change{
				{ID: 1, Op: ChangeGrant, Resource: "project/x", Token: 1, Owner: "h1-1", Expires: at(2), Tx: 1, At: at(-0.01)},
				{ID: 2, Op: ChangeDelete, Resource: "project/x", Token: 1, Owner: "h1-1", Expires: at(2), Tx: 2, At: at(2.1)},
				{ID: 3, Op: ChangeGrant, Resource: "project/x", Token: 2, Owner: "h2-1", Expires: at(4.1), Tx: 2, At: at(2.1)},
			}}
			return ev, tb
		}},
		{"EstimateOutsideItsUncertainty", []string{VEstimate}, func() ([]Event, Tables) {
			// h2's estimate of the server's time lags by 3 s while it
			// states an uncertainty of 23.6 µs.
			ev, tb := clean()
			ev[6].Estimate, ev[6].EstimateFrom, ev[6].EstimateTo = at(2).Add(-3*time.Second), at(2), at(2).Add(time.Microsecond)
			ev[6].Uncertainty = 23600 * time.Nanosecond
			return ev, tb
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev, tables := tc.history()
			got := Check(ev, tables, at(40), testLimits)
			t.Log(got)
			kinds := map[string]bool{}
			for _, v := range got {
				kinds[v.Kind] = true
				assert.Contains(t, tc.kinds, v.Kind, v.Detail)
			}
			for _, k := range tc.kinds {
				assert.True(t, kinds[k], "the checker missed %s", k)
			}
		})
	}
}

// Under the latency fault a holder hears of its release's commit late: the
// server's log, which shows the release before the next grant, decides.
func TestCheck_ReleaseHeardLateButLoggedFirst(t *testing.T) {
	ev, tables := clean()
	ev = unreleased(ev) // h1's write ended at 1.9 s, after token 2's grant
	ev = append(ev, Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "plan/p1", Token: 1, At: at(2.2)})
	assert.Empty(t, Check(ev, withChanges(tables), at(30), testLimits))
}
