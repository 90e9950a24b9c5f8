//go:build linux

package hosts

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
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

// inject runs the schedule from begin: each start and end at its time, in
// order, on the test's goroutine (a server restart holds the others back
// while it runs).
func (h *harness) inject(begin time.Time, faults []fault) {
	type action struct {
		at  time.Duration
		run func()
	}
	var actions []action
	for _, f := range faults {
		var started time.Time
		record := func() {
			h.add(Event{Kind: KindFault, Fault: f.kind, Host: hostNameOr(f.host), At: started, End: time.Now()})
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
				<-c.proc.done
			case FaultClock:
				c.clock += f.step
				fmt.Fprintf(c.proc.stdin, "clock %s\n", c.clock)
				record()
			case FaultRestart:
				h.srv.Stop("immediate")
				h.srv.Restart()
				record()
			case FaultLatency:
				undo, err = toxic(c.proxy, "latency", `{"latency":300,"jitter":100}`)
			case FaultBlackhole:
				undo, err = toxic(c.proxy, "timeout", `{"timeout":0}`)
			case FaultReset:
				undo, err = toxic(c.proxy, "reset_peer", `{"timeout":0}`)
			}
			require.NoError(h.t, err, f.kind)
		}
		endFn := func() {
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
	for _, a := range actions {
		if wait := time.Until(begin.Add(a.at)); wait > 0 {
			time.Sleep(wait) // the schedule's own pace
		}
		a.run()
	}
}

func hostNameOr(i int) string {
	if i == 0 {
		return ""
	}
	return hostName(i)
}
