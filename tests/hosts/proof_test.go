package hosts

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testProof = ProofLimits{Settle: time.Second, MinRoundTrip: 300 * time.Millisecond, ClockRead: 5 * time.Second, ClockSlack: time.Second}

// proven is a run whose every fault took effect: h1 partitioned from 10 s
// to 17 s, h2 paused from 20 s to 27 s, h3 blackholed from 30 s to 37 s,
// each committing only outside its fault, or inside it a transaction
// begun before it (a statement that waited on another's lock); h1 under
// latency, h2 killed, h3's clock stepped ahead 10 minutes, the server
// restarted, h1's connections reset.
func proven() ([]FaultSeen, []Event, []Commit) {
	seen := []FaultSeen{
		{Kind: FaultPartition, Host: "h1", At: at(10), In: at(10.05), Out: at(17), End: at(17.05)},
		{Kind: FaultPause, Host: "h2", At: at(20), In: at(20.01), Out: at(27), End: at(27.01)},
		{Kind: FaultBlackhole, Host: "h3", At: at(30), In: at(30.01), Out: at(37), End: at(37.01)},
		{Kind: FaultLatency, Host: "h1", At: at(40), In: at(40.01), Out: at(48), End: at(48.01), RoundTrip: 612 * time.Millisecond},
		{Kind: FaultKill, Host: "h2", At: at(50), In: at(50.1), Out: at(51), End: at(51.2)},
		{Kind: FaultClock, Host: "h3", At: at(55), End: at(55.01), Offset: 10 * time.Minute},
		{Kind: FaultRestart, At: at(60), In: at(62), End: at(62), ServerStart: at(61.5)},
		{Kind: FaultReset, Host: "h1", At: at(65), In: at(65.01), Out: at(66), End: at(66.01), ProbeErr: "read tcp 10.213.1.1:40000->10.213.1.1:5432: read: connection reset by peer"},
	}
	events := []Event{
		{Kind: KindStarted, Host: "h1", Owner: "h1-1", At: at(0)},
		{Kind: KindStarted, Host: "h2", Owner: "h2-1", At: at(0)},
		{Kind: KindStarted, Host: "h3", Owner: "h3-1", At: at(0)},
		{Kind: KindStarted, Host: "h2", Owner: "h2-2", At: at(51.1)},
		{Kind: KindClock, Host: "h3", Owner: "h3-1", At: at(55.02), Clock: at(55.02).Add(10 * time.Minute)},
	}
	commits := []Commit{
		// h1, around its partition: just before, one begun before it
		// that waited, one begun within Settle of it, and after.
		{Owner: "h1-1", What: "write h1-1-1", Began: at(9.9), At: at(9.95)},
		{Owner: "h1-1", What: "grant plan/p1 token 4", Began: at(9.98), At: at(12)},
		{Owner: "h1-1", What: "extend project/h1 token 2", Began: at(10.9), At: at(10.91)},
		{Owner: "h1-1", What: "write h1-1-2", Began: at(17.1), At: at(17.2)},
		// the others go on meanwhile.
		{Owner: "h2-1", What: "write h2-1-1", Began: at(12), At: at(12.1)},
		{Owner: "h3-1", What: "write h3-1-1", Began: at(13), At: at(13.1)},
		// h2 and h3 around theirs.
		{Owner: "h2-1", What: "write h2-1-2", Began: at(19.9), At: at(20.2)},
		{Owner: "h2-1", What: "write h2-1-3", Began: at(26.99), At: at(27.05)},
		{Owner: "h3-1", What: "write h3-1-2", Began: at(30.5), At: at(30.51)},
		{Owner: "h3-1", What: "grant log/r1 token 9", Began: at(37.02), At: at(37.03)},
	}
	return seen, events, commits
}

func TestProveFaults_Proven(t *testing.T) {
	seen, events, commits := proven()
	assert.Empty(t, ProveFaults(seen, events, commits, testProof))
}

// Each case undoes the effect of one fault of proven(); the proof must
// fail that fault, and only it, naming it and what was seen.
func TestProveFaults_NoEffect(t *testing.T) {
	cases := []struct {
		name   string
		detail []string // in the violation's detail
		plant  func(seen []FaultSeen, events []Event, commits []Commit) ([]Event, []Commit)
	}{
		{"PartitionThatLetAWriteThrough", []string{"partition of h1 from 12:00:10.000 to 12:00:17.050", "1 transactions", "write h1-1-9 of h1-1"},
			func(_ []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				return ev, append(cs, Commit{Owner: "h1-1", What: "write h1-1-9", Began: at(14), At: at(14.01)})
			}},
		{"PartitionThatLetAGrantThroughJustBeforeItsEnd", []string{"partition of h1", "grant plan/p2 token 7"},
			func(_ []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				return ev, append(cs, Commit{Owner: "h1-1", What: "grant plan/p2 token 7", Began: at(16.99), At: at(17)})
			}},
		{"PauseOfAProcessThatWentOn", []string{"pause of h2", "2 transactions", "write h2-1-8 of h2-1"},
			func(_ []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				return ev, append(cs, Commit{Owner: "h2-1", What: "write h2-1-9", Began: at(25), At: at(25.01)},
					Commit{Owner: "h2-1", What: "write h2-1-8", Began: at(22), At: at(22.01)})
			}},
		{"BlackholeThatForwarded", []string{"blackhole of h3", "extend project/h3 token 3"},
			func(_ []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				return ev, append(cs, Commit{Owner: "h3-1", What: "extend project/h3 token 3", Began: at(31.01), At: at(31.02)})
			}},
		{"LatencyNotSeen", []string{"latency of h1", "answered in 2ms"},
			func(seen []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				seen[3].RoundTrip = 2 * time.Millisecond
				return ev, cs
			}},
		{"LatencyNotProbed", []string{"latency of h1", "no probe", "connection refused"},
			func(seen []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				seen[3].RoundTrip, seen[3].ProbeErr = 0, "dial tcp: connection refused"
				return ev, cs
			}},
		{"KillThatLeftAProcess", []string{"kill of h2", "pid 4242 (locks.test) state S"},
			func(seen []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				seen[4].Left = "pid 4242 (locks.test) state S"
				return ev, cs
			}},
		{"ResetAnswered", []string{"reset of h1", "answered in 1ms", "not reset"},
			func(seen []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				seen[7].RoundTrip, seen[7].ProbeErr = time.Millisecond, ""
				return ev, cs
			}},
		{"ResetTimedOut", []string{"reset of h1", "not reset either", "i/o timeout"},
			func(seen []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				seen[7].ProbeErr = "read tcp 10.213.1.1:40000->10.213.1.1:5432: i/o timeout"
				return ev, cs
			}},
		{"RestartOfAServerThatKeptRunning", []string{"restart of the server from 12:01:00.000", "start time read after it was 11:59:58.000", "had not restarted"},
			func(seen []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				seen[6].ServerStart = at(-2)
				return ev, cs
			}},
		{"RestartOfAServerThatDidNotAnswer", []string{"restart of", "could not be read", "connection refused"},
			func(seen []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				seen[6].ServerStart, seen[6].ServerErr = time.Time{}, "dial tcp 127.0.0.1:5433: connection refused"
				return ev, cs
			}},
		{"ClockNotRead", []string{"clock of h3", "no reading", "10m0s"},
			func(_ []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				return ev[:4], cs
			}},
		{"ClockReadLate", []string{"clock of h3", "no reading"},
			func(_ []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				ev[4].At = at(61)
				ev[4].Clock = ev[4].At.Add(10 * time.Minute)
				return ev, cs
			}},
		{"ClockNotStepped", []string{"clock of h3", "0s from the real time", "not the 10m0s"},
			func(_ []FaultSeen, ev []Event, cs []Commit) ([]Event, []Commit) {
				ev[4].Clock = ev[4].At
				return ev, cs
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seen, events, commits := proven()
			events, commits = tc.plant(seen, events, commits)
			vs := ProveFaults(seen, events, commits, testProof)
			require.Len(t, vs, 1, "%v", vs)
			assert.Equal(t, VNoEffect, vs[0].Kind)
			for _, d := range tc.detail {
				assert.Contains(t, vs[0].Detail, d)
			}
		})
	}
}
