//go:build linux

package hosts

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// proxies is the embedded Toxiproxy: one proxy per host, listening on the
// root side of the host's veth, in front of the server.
type proxies struct{ server *toxiproxy.ApiServer }

func newProxies() *proxies {
	return &proxies{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())}
}

func (p *proxies) add(t *testing.T, name, listen, upstream string) *toxiproxy.Proxy {
	t.Helper()
	px := toxiproxy.NewProxy(p.server, name, listen, upstream)
	require.NoError(t, px.Start())
	return px
}

// toxic adds a toxic to both directions of a proxy; the function returned
// removes them.
func toxic(px *toxiproxy.Proxy, kind, attributes string) (func(), error) {
	var names []string
	for _, stream := range []string{"upstream", "downstream"} {
		name := kind + "-" + stream
		js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, kind, stream, attributes)
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return func() {
		for _, n := range names {
			_ = px.Toxics.RemoveToxic(context.Background(), n)
		}
	}, nil
}

// fault is one planned fault: kind on host (0: the server) from at for
// dur after the run's start.
type fault struct {
	kind    string
	host    int
	at, dur time.Duration
	step    time.Duration // a clock step
}

// How long each fault lasts: the cut-offs and the pause outlast the TTL,
// so that locks are lost and taken over under them.
var faultDuration = map[string]time.Duration{
	FaultPartition: ttl + 2*time.Second,
	FaultPause:     ttl + 2*time.Second,
	FaultKill:      time.Second, // until the replacement starts
	FaultClock:     0,
	FaultRestart:   0, // as long as the server takes to stop and start
	FaultLatency:   8 * time.Second,
	FaultBlackhole: ttl + 2*time.Second,
	FaultReset:     time.Second,
}

// schedule plans the faults of a run of dur. A short run injects every
// kind once, in an order and on hosts the seed picks, one every 5 s; a
// long run picks kinds at random, every 2–8 s. A host has one fault at a
// time, and the run ends with a quiet tail as long as the checker's
// recovery limit.
func schedule(rng *rand.Rand, dur time.Duration, short bool) []fault {
	busy := make([]time.Duration, nHosts+1)
	var out []fault
	at := 3 * time.Second
	kinds := append([]string(nil), AllFaults...)
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	for n := 0; ; n++ {
		var kind string
		if short {
			if n == len(kinds) {
				break
			}
			kind = kinds[n]
		} else {
			kind = AllFaults[rng.IntN(len(AllFaults))]
		}
		f := fault{kind: kind, dur: faultDuration[kind]}
		if kind != FaultRestart {
			var free []int
			for i := 1; i <= nHosts; i++ {
				if busy[i] <= at {
					free = append(free, i)
				}
			}
			if len(free) == 0 {
				at += time.Second
				n--
				continue
			}
			f.host = free[rng.IntN(len(free))]
			busy[f.host] = at + f.dur + 2*time.Second
		}
		if kind == FaultClock {
			f.step = 10 * time.Minute
			if rng.IntN(2) == 0 {
				f.step = -f.step
			}
		}
		f.at = at
		if !short && at+f.dur+limits.Recovery+5*time.Second > dur {
			break
		}
		out = append(out, f)
		if short {
			at += 5 * time.Second
		} else {
			at += 2*time.Second + time.Duration(rng.Int64N(int64(6*time.Second)))
		}
	}
	return out
}

// The latency fault's toxic: 300 ± 100 ms each way.
const (
	latencyMs = 300
	jitterMs  = 100
)

// proof is the margins that ProveFaults allows this loaded machine. A
// statement on its way when a host is cut off reaches the server within
// milliseconds even here; 2 s of the 7 s cut-offs leave 5 s in which a
// working host commits every time (renewals alone come every 2.5 s of a
// holder). A probe through the latency toxic takes 400 ms at least.
var proof = ProofLimits{Settle: 2 * time.Second, MinRoundTrip: 2*(latencyMs-jitterMs)*time.Millisecond - 100*time.Millisecond,
	ClockRead: 10 * time.Second, ClockSlack: time.Second}

// proofSchema dates each transaction's start on the server too (now() is
// the start of the changing transaction): a statement sent before a
// cut-off and kept waiting on another's lock may commit under it, one
// begun under it may not.
var proofSchema = []string{
	`ALTER TABLE writes ADD COLUMN began TIMESTAMPTZ NOT NULL DEFAULT now()`,
	`ALTER TABLE lock_changes ADD COLUMN began TIMESTAMPTZ NOT NULL DEFAULT now()`,
}

// readCommits reads the hosts' commits as the server recorded them, for
// ProveFaults: the writes, and the grants and renewals of the locks
// table's log (a deletion may be another host's takeover or purge).
func (h *harness) readCommits() []Commit {
	rows, err := h.srv.Open("hosts").Query(`SELECT owner, 'write ' || attempt, began, at FROM writes
		UNION ALL SELECT owner, op || ' ' || resource || ' token ' || token, began, at FROM lock_changes WHERE op <> '` + ChangeDelete + `'`)
	require.NoError(h.t, err)
	defer rows.Close()
	var out []Commit
	for rows.Next() {
		var c Commit
		require.NoError(h.t, rows.Scan(&c.Owner, &c.What, &c.Began, &c.At))
		out = append(out, c)
	}
	require.NoError(h.t, rows.Err())
	return out
}

// proveFaults holds the run's faults to their effects (ProveFaults), and
// logs how close the cut-offs came to failing it: the transactions of the
// host that the server began while the fault was in place, all from
// before Settle, the latest how long after In.
func (h *harness) proveFaults(seen []FaultSeen, events []Event) []Violation {
	commits := h.readCommits()
	hostOf := hostsOf(events)
	for _, f := range seen {
		if f.Kind != FaultPartition && f.Kind != FaultPause && f.Kind != FaultBlackhole {
			continue
		}
		n, latest := 0, time.Duration(0)
		for _, c := range commits {
			if hostOf[c.Owner] == f.Host && !c.Began.Before(f.In) && !c.At.After(f.Out) {
				n, latest = n+1, max(latest, c.Began.Sub(f.In))
			}
		}
		h.t.Logf("%s %s %s: %d transactions of the host begun while it was in place and changed before its end, the latest begun %v after it was in place",
			stamp(f.At), f.Kind, f.Host, n, latest.Round(time.Millisecond))
	}
	return ProveFaults(seen, events, commits, proof)
}

// probe measures a round trip through a proxy: PostgreSQL's SSLRequest,
// which the server answers with one byte before any authentication. It
// tries until one is answered or until is past (a server restart may
// refuse some).
func probe(addr string, until time.Time) (time.Duration, string) {
	last := "no time left to send one"
	for time.Now().Before(until) {
		rtt, err := probeOnce(addr, until)
		if err == nil {
			return rtt, ""
		}
		last = err.Error()
		time.Sleep(100 * time.Millisecond) // the probe's own pace, not a wait for a state
	}
	return 0, last
}

// probeOnce is one of probe's requests, answered before until or not.
func probeOnce(addr string, until time.Time) (time.Duration, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Until(until))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(until); err != nil {
		return 0, err
	}
	sent := time.Now()
	if _, err := conn.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		return 0, err
	}
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		return 0, err
	}
	return time.Since(sent), nil
}

// serverStart reads the server's start time, for a restart's proof.
func (h *harness) serverStart() (time.Time, string) {
	var t time.Time
	if err := h.srv.Open("hosts").QueryRow(`SELECT pg_postmaster_start_time()`).Scan(&t); err != nil {
		return time.Time{}, err.Error()
	}
	return t, ""
}

// leftOf names the processes of group pgid that are not gone (zombies
// are: this machine's init may never reap them), waiting up to bound for
// them to go.
func leftOf(pgid int, bound time.Duration) string {
	deadline := time.Now().Add(bound)
	for {
		var left []string
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, name := range stats {
			b, err := os.ReadFile(name)
			if err != nil {
				continue // gone meanwhile
			}
			s := string(b)
			i := strings.LastIndexByte(s, ')')
			if i < 0 {
				continue
			}
			f := strings.Fields(s[i+1:]) // state ppid pgrp ...
			if len(f) < 3 || f[0] == "Z" || f[0] == "X" || f[2] != strconv.Itoa(pgid) {
				continue
			}
			left = append(left, fmt.Sprintf("%s state %s", s[:i+1], f[0]))
		}
		if len(left) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(left, ", ")
		}
		time.Sleep(50 * time.Millisecond) // polls the kernel's state: there is no event for it
	}
}

// evidence is what the harness saw of a fault's effect itself; the
// cut-offs' is the server's, which ProveFaults reads after the run.
func (s FaultSeen) evidence() string {
	switch s.Kind {
	case FaultLatency:
		if s.RoundTrip == 0 {
			return ", no probe answered: " + s.ProbeErr
		}
		return fmt.Sprintf(", a probe answered in %v", s.RoundTrip.Round(time.Millisecond))
	case FaultReset:
		if s.RoundTrip > 0 {
			return fmt.Sprintf(", a probe answered in %v", s.RoundTrip.Round(time.Millisecond))
		}
		return ", a probe got " + s.ProbeErr
	case FaultRestart:
		if s.ServerStart.IsZero() {
			return ", its start time unread: " + s.ServerErr
		}
		return ", the server started at " + stamp(s.ServerStart)
	case FaultKill:
		if s.Left != "" {
			return ", left: " + s.Left
		}
		return ", its processes gone"
	case FaultClock:
		return fmt.Sprintf(", its clock set to %v off", s.Offset)
	}
	return ""
}

// inject runs the schedule from begin: each start and end at its time, in
// order, on the test's goroutine. A server restart holds the others back
// while it runs (17 s on this loaded machine, at times): the rest of the
// schedule then runs that much later, so that every fault keeps its length
// rather than end as it starts. It returns what it saw of each fault, for
// ProveFaults, and how late the schedule ended.
func (h *harness) inject(begin time.Time, faults []fault) ([]FaultSeen, time.Duration) {
	type action struct {
		at  time.Duration
		run func()
	}
	var actions []action
	seen := make([]FaultSeen, len(faults))
	defer func() { // what each fault's proof rests on, for the record
		for _, s := range seen {
			h.t.Logf("%s %s %s: in place %v after its start%s", stamp(s.At), s.Kind, s.Host, s.In.Sub(s.At).Round(time.Millisecond), s.evidence())
		}
	}()
	var probes sync.WaitGroup
	defer probes.Wait()
	for k, f := range faults {
		var started time.Time
		s := &seen[k]
		s.Kind, s.Host = f.kind, hostNameOr(f.host)
		record := func() {
			s.At, s.End = started, time.Now()
			h.add(Event{Kind: KindFault, Fault: f.kind, Host: hostNameOr(f.host), At: started, End: s.End})
			h.t.Logf("%s %s %s: %v", stamp(started), f.kind, hostNameOr(f.host), time.Since(started).Round(time.Millisecond))
		}
		var c *host
		if f.host > 0 {
			c = h.hosts[f.host-1]
		}
		var undo func()
		var stopped *proc
		startFn := func() {
			started = time.Now()
			var err error
			switch f.kind {
			case FaultPartition:
				err = ipCmd("link", "set", rootVeth(h.pid, f.host), "down")
			case FaultPause:
				stopped = c.proc
				stopped.signal(syscall.SIGSTOP)
			case FaultKill:
				c.proc.signal(syscall.SIGKILL)
				select {
				case <-c.proc.done:
				case <-time.After(10 * time.Second):
				}
				s.Left = leftOf(c.proc.cmd.Process.Pid, 5*time.Second)
			case FaultClock:
				c.clock += f.step
				s.Offset = c.clock
				fmt.Fprintf(c.proc.stdin, "clock %s\n", c.clock)
				record()
			case FaultRestart:
				h.srv.Stop("immediate")
				h.srv.Restart()
				s.ServerStart, s.ServerErr = h.serverStart()
				record()
			case FaultLatency:
				undo, err = toxic(c.proxy, "latency", fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latencyMs, jitterMs))
				until := started.Add(f.dur - time.Second)
				probes.Go(func() { s.RoundTrip, s.ProbeErr = probe(c.proxy.Listen, until) })
			case FaultBlackhole:
				undo, err = toxic(c.proxy, "timeout", `{"timeout":0}`)
			case FaultReset:
				undo, err = toxic(c.proxy, "reset_peer", `{"timeout":0}`)
				if err == nil { // at once, on this goroutine: the toxic is in place until it returns
					var perr error
					if s.RoundTrip, perr = probeOnce(c.proxy.Listen, time.Now().Add(2*time.Second)); perr != nil {
						s.ProbeErr = perr.Error()
					}
				}
			}
			s.In = time.Now()
			require.NoError(h.t, err, f.kind)
		}
		endFn := func() {
			s.Out = time.Now()
			switch f.kind {
			case FaultPartition:
				require.NoError(h.t, ipCmd("link", "set", rootVeth(h.pid, f.host), "up"))
			case FaultPause:
				stopped.signal(syscall.SIGCONT)
			case FaultKill:
				h.start(c)
			case FaultClock, FaultRestart:
				return
			default:
				undo()
			}
			record()
		}
		actions = append(actions, action{f.at, startFn}, action{f.at + f.dur, endFn})
	}
	sort.SliceStable(actions, func(i, j int) bool { return actions[i].at < actions[j].at })
	var late time.Duration
	for _, a := range actions {
		if wait := time.Until(begin.Add(a.at + late)); wait > 0 {
			time.Sleep(wait) // the schedule's own pace
		} else {
			late -= wait
		}
		a.run()
	}
	return seen, late
}

func hostNameOr(i int) string {
	if i == 0 {
		return ""
	}
	return hostName(i)
}
