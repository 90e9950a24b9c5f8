package hosts

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The server's log of the clean history, and changes to it that a single
// correct lock could also have made: the checker accepts them.
func TestCheck_LinearizableLogs(t *testing.T) {
	cases := []struct {
		name  string
		plant func(ev []Event, tb *Tables) []Event
	}{
		{"AsRecorded", func(ev []Event, tb *Tables) []Event { return ev }},
		{"TakeoverOfAnExpiredLock", func(ev []Event, tb *Tables) []Event {
			// Token 1 lapsed at 3 s; token 2's transaction deleted it at
			// 3.1 s and was granted.
			ev = slices.DeleteFunc(ev, func(e Event) bool { return e.Token == 2 || e.Kind == KindReleased })
			tb.Rows, tb.Counters["plan/p1"] = slices.Delete(tb.Rows, 1, 2), 1
			tb.Changes[2].Tx, tb.Changes[2].At = 4, at(3.1)
			tb.Changes[3].At = at(3.1)
			return append(ev, Event{Kind: KindAcquired, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(3.2), Expires: at(5.1), Stored: at(3.09)})
		}},
		{"TakeoverOfAGoneProcess", func(ev []Event, tb *Tables) []Event {
			// h1-1 was killed; h1-2, on the same host, took its lock
			// before it expired, as it may, and said so.
			ev = slices.DeleteFunc(ev, func(e Event) bool { return e.Token == 2 || e.Kind == KindReleased })
			tb.Rows, tb.Counters["plan/p1"] = slices.Delete(tb.Rows, 1, 2), 1
			tb.Changes[2].Tx, tb.Changes[2].At = 4, at(2.5)
			tb.Changes[3].At, tb.Changes[3].Owner = at(2.5), "h1-2"
			return append(ev, Event{Kind: KindAcquired, Host: "h1", Owner: "h1-2", Resource: "plan/p1", Token: 2, At: at(2.6),
				Expires: at(4.5), Stored: at(2.49), DeadHolder: true})
		}},
		{"TakeoverLoggedGrantFirst", func(ev []Event, tb *Tables) []Event {
			// One statement deleted the lapsed token 1 and granted token
			// 2; its triggers fired grant first.
			ev = slices.DeleteFunc(ev, func(e Event) bool { return e.Token == 2 || e.Kind == KindReleased })
			tb.Rows, tb.Counters["plan/p1"] = slices.Delete(tb.Rows, 1, 2), 1
			tb.Changes[2], tb.Changes[3] = tb.Changes[3], tb.Changes[2]
			tb.Changes[2].ID, tb.Changes[3].ID = 3, 4
			tb.Changes[2].Tx, tb.Changes[2].At = 4, at(3.1)
			tb.Changes[3].Tx, tb.Changes[3].At = 4, at(3.1)
			return append(ev, Event{Kind: KindAcquired, Host: "h2", Owner: "h2-1", Resource: "plan/p1", Token: 2, At: at(3.2), Expires: at(5.1), Stored: at(3.09)})
		}},
		{"RenewalWithinItsOwnersUncertainty", func(ev []Event, tb *Tables) []Event {
			// Token 2 (until 3.8 s) extended at 3.82 s: within the 50 ms
			// of slack, its owner's estimate may have said 3.79 s.
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeExtend, Resource: "plan/p1", Token: 2, Owner: "h2-1", Expires: at(5.8), Tx: 6, At: at(3.82)})
			return ev
		}},
		{"RenewalDecidedInTimeLoggedLate", func(ev []Event, tb *Tables) []Event {
			// Token 2 (until 3.8 s, TTL 2 s) extended to 5.79 s: decided
			// at 3.79 s on its owner's estimate, its statement reached the
			// server at 4.3 s (the latency fault).
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeExtend, Resource: "plan/p1", Token: 2, Owner: "h2-1", Expires: at(5.79), Tx: 6, At: at(4.3)})
			return ev
		}},
		{"ReleaseLostInARestart", func(ev []Event, tb *Tables) []Event {
			// h1 was told token 3 was released at 17 s; the server,
			// stopped at once 0.3 s later, lost the release (it does not
			// wait for its WAL) and the lock came back to expire.
			return recoveredAt19(append(ev,
				Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(17)},
				Event{Kind: KindFault, Fault: FaultRestart, At: at(17.3), End: at(18)}), tb)
		}},
		{"ReleaseAnsweredAsTheRestartBegan", func(ev []Event, tb *Tables) []Event {
			// The harness recorded the restart at 17.3 s; the server took
			// the signal to stop some milliseconds later and, in between,
			// told h1 that token 3 was released (recorded at 17.317 s),
			// then lost the release with its WAL (seed 1796467910150779586).
			return recoveredAt19(append(ev,
				Event{Kind: KindFault, Fault: FaultRestart, At: at(17.3), End: at(18)},
				Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(17.317)}), tb)
		}},
		{"ReleasedByItsHolderBeforeItsExpiry", func(ev []Event, tb *Tables) []Event {
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeDelete, Resource: "log/r1", Token: 3, Owner: "h1-1", Expires: at(17), Tx: 6, At: at(16.05)})
			return append(ev, Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(16.1)})
		}},
		{"PurgeOfAnExpiredLock", func(ev []Event, tb *Tables) []Event {
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeDelete, Resource: "log/r1", Token: 3, Owner: "h1-1", Expires: at(17), Tx: 6, At: at(18)})
			return ev
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev, tables := clean()
			tables = withChanges(tables)
			ev = tc.plant(ev, &tables)
			assert.Empty(t, Check(ev, tables, at(40), testLimits))
		})
	}
}

// Logs no single lock could have made, or that a host's view contradicts:
// the checker reports each, with the kind named and no other.
func TestCheck_NotLinearizable(t *testing.T) {
	cases := []struct {
		name  string
		kind  string
		plant func(ev []Event, tb *Tables) []Event
	}{
		{"TwoRowsAtOnce", VLinear, func(ev []Event, tb *Tables) []Event {
			// Token 2 granted while token 1's row still stood: its
			// deletion logged after.
			tb.Changes[2].ID, tb.Changes[3].ID = 4, 3
			return ev
		}},
		{"TokenNotAboveTheLast", VTokenOrder, func(ev []Event, tb *Tables) []Event {
			tb.Changes = append(tb.Changes,
				Change{ID: 6, Op: ChangeDelete, Resource: "log/r1", Token: 3, Owner: "h1-1", Expires: at(17), Tx: 6, At: at(18)},
				Change{ID: 7, Op: ChangeGrant, Resource: "log/r1", Token: 2, Owner: "h3-1", Expires: at(20), Tx: 7, At: at(18.1)})
			return ev
		}},
		{"RenewalOfALapsedLock", VLinear, func(ev []Event, tb *Tables) []Event {
			// Token 2 (until 3.8 s) extended at 5 s, after it lapsed.
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeExtend, Resource: "plan/p1", Token: 2, Owner: "h2-1", Expires: at(7), Tx: 6, At: at(5)})
			return ev
		}},
		{"ExtensionOfAnotherToken", VLinear, func(ev []Event, tb *Tables) []Event {
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeExtend, Resource: "plan/p1", Token: 1, Owner: "h1-1", Expires: at(7), Tx: 6, At: at(2)})
			return ev
		}},
		{"TakeoverOfALiveProcessOnTheSameHost", VEarlyTakeover, func(ev []Event, tb *Tables) []Event {
			// h1-2 took over h1-1's lock before it expired, and said it
			// was not a dead holder's.
			ev = slices.DeleteFunc(ev, func(e Event) bool { return e.Token == 2 || e.Kind == KindReleased })
			tb.Rows, tb.Counters["plan/p1"] = slices.Delete(tb.Rows, 1, 2), 1
			tb.Changes[2].Tx, tb.Changes[2].At = 4, at(2.5)
			tb.Changes[3].At, tb.Changes[3].Owner = at(2.5), "h1-2"
			return append(ev, Event{Kind: KindAcquired, Host: "h1", Owner: "h1-2", Resource: "plan/p1", Token: 2, At: at(2.6),
				Expires: at(4.5), Stored: at(2.49)})
		}},
		{"RemovedUnderItsHolder", VRemoved, func(ev []Event, tb *Tables) []Event {
			// Token 3, good until 17 s, deleted at 15.95 s by no grant;
			// its holder learned of the loss at 16.5 s: a purge decided
			// on a clock ahead, or a release by owner from a sibling.
			tb.Changes = append(tb.Changes, Change{ID: 6, Op: ChangeDelete, Resource: "log/r1", Token: 3, Owner: "h1-1", Expires: at(17), Tx: 6, At: at(15.95)})
			return append(ev, Event{Kind: KindLost, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(16.5)})
		}},
		{"AcquiredButNeverGranted", VLinear, func(ev []Event, tb *Tables) []Event {
			tb.Changes = slices.Delete(tb.Changes, 4, 5) // token 3's grant
			return ev
		}},
		{"AcquiredBeforeTheGrant", VLinear, func(ev []Event, tb *Tables) []Event {
			tb.Changes[4].At = at(15.5) // h1 recorded token 3 at 15 s
			return ev
		}},
		{"GrantedToAnotherOwner", VLinear, func(ev []Event, tb *Tables) []Event {
			tb.Changes[4].Owner = "h3-1"
			return ev
		}},
		{"RenewedButNotExtended", VLinear, func(ev []Event, tb *Tables) []Event {
			tb.Changes[1].Expires = at(2.5)
			return ev
		}},
		{"ReleasedButNotDeleted", VLinear, func(ev []Event, tb *Tables) []Event {
			return append(ev, Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(17)})
		}},
		{"ReleasedAfterARestartButNotDeleted", VLinear, func(ev []Event, tb *Tables) []Event {
			// The restart ended at 18 s; a release the server answered
			// after it was not lost to it.
			return recoveredAt19(append(ev,
				Event{Kind: KindFault, Fault: FaultRestart, At: at(15.5), End: at(18)},
				Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(18.05)}), tb)
		}},
		{"ReleasedLongBeforeARestartButNotDeleted", VLinear, func(ev []Event, tb *Tables) []Event {
			// Its WAL was written long before the server stopped.
			return recoveredAt19(append(ev,
				Event{Kind: KindReleased, Host: "h1", Owner: "h1-1", Resource: "log/r1", Token: 3, At: at(16.2)},
				Event{Kind: KindFault, Fault: FaultRestart, At: at(17.3), End: at(18)}), tb)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev, tables := clean()
			tables = withChanges(tables)
			ev = tc.plant(ev, &tables)
			got := Check(ev, tables, at(40), testLimits)
			t.Log(got)
			if assert.NotEmpty(t, got, "the checker missed the planted %s", tc.kind) {
				for _, v := range got {
					assert.Equal(t, tc.kind, v.Kind, v.Detail)
				}
			}
		})
	}
}

// recoveredAt19 adds a committed write of h1 and of h2 at 19 s, after a
// restart that ended at 18 s, as the recovery rule asks.
func recoveredAt19(ev []Event, tb *Tables) []Event {
	tb.Rows = append(tb.Rows,
		Row{ID: 4, Kind: "do", Resource: "log/r2", Token: 10, Owner: "h1-1", Attempt: "a9", At: at(18.9)},
		Row{ID: 5, Kind: "do", Resource: "log/r3", Token: 11, Owner: "h2-1", Attempt: "a10", At: at(18.9)})
	return append(ev,
		Event{Kind: KindWrite, Host: "h1", Owner: "h1-1", Resource: "log/r2", Token: 10, At: at(19), Outcome: Committed, Attempt: "a9"},
		Event{Kind: KindWrite, Host: "h2", Owner: "h2-1", Resource: "log/r3", Token: 11, At: at(19), Outcome: Committed, Attempt: "a10"})
}
