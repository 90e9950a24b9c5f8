//go:build linux

package hosts

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	_ "github.com/cleveragents/locks/adapters/postgres" // the hosts open postgres:// DSNs
	"github.com/cleveragents/locks/tests/pgserver"
)

const (
	// LOCKS_HOSTS_DURATION runs longer, with faults at random, e.g.
	// LOCKS_HOSTS_DURATION=10m go test -timeout 15m ./tests/hosts; the
	// default is the short run of about a minute, every fault kind once.
	envDuration = "LOCKS_HOSTS_DURATION"
	// LOCKS_HOSTS_SEED replays the faults of a run: the run prints its seed.
	envSeed = "LOCKS_HOSTS_SEED"
	// LOCKS_HOSTS_HISTORY names a file to keep the history in (JSON
	// lines); a failed run keeps it in the temporary directory anyway.
	envHistory = "LOCKS_HOSTS_HISTORY"

	nHosts        = 3
	shortDuration = 60 * time.Second
)

// startClocks are the hosts' clocks' offsets from the start: hosts whose
// clocks disagree, by more than a TTL either way, so that whatever
// decided expiry on a host's own clock rather than on the server's takes
// or purges a live lock, or keeps one past its expiry, in every run and
// not only after the clock fault's step (whose sign the seed picks).
var startClocks = []time.Duration{time.Minute, -time.Minute, 0}

// EstimateSlack is small: the server's clock is this kernel's, which the
// hosts' monotonic clocks follow at its rate, so an estimate is off by at
// most half its round trip, plus the server's microsecond readings.
var limits = Limits{LossBound: time.Second, Recovery: 15 * time.Second, PauseSlack: time.Second, EventSlack: 50 * time.Millisecond,
	EstimateSlack: 100 * time.Microsecond}

// changeLog makes the server log every change of the locks table (Change),
// in the changing transaction, whether or not its host lives to report it.
// The expiry is kept as the text stored: a cast that failed would fail the
// store's own statement.
var changeLog = []string{
	`CREATE TABLE lock_changes (id BIGSERIAL PRIMARY KEY, op TEXT NOT NULL, resource TEXT NOT NULL, token BIGINT NOT NULL,
		owner TEXT NOT NULL, acquired TEXT NOT NULL, expires TEXT NOT NULL, tx BIGINT NOT NULL DEFAULT txid_current(),
		at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())`,
	`CREATE FUNCTION log_lock_change() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF TG_OP = 'DELETE' THEN
			INSERT INTO lock_changes (op, resource, token, owner, acquired, expires)
			VALUES ('` + ChangeDelete + `', OLD.resource_type || '/' || OLD.resource_id, OLD.id, OLD.owner_id, OLD.acquired_at, OLD.expires_at);
			RETURN OLD;
		END IF;
		INSERT INTO lock_changes (op, resource, token, owner, acquired, expires)
		VALUES (CASE TG_OP WHEN 'INSERT' THEN '` + ChangeGrant + `' ELSE '` + ChangeExtend + `' END,
			NEW.resource_type || '/' || NEW.resource_id, NEW.id, NEW.owner_id, NEW.acquired_at, NEW.expires_at);
		RETURN NEW;
	END $$`,
	`CREATE TRIGGER log_lock_change AFTER INSERT OR UPDATE OR DELETE ON locks FOR EACH ROW EXECUTE FUNCTION log_lock_change()`,
}

func TestMain(m *testing.M) {
	if os.Getenv(envWorker) != "" {
		os.Exit(workerMain())
	}
	os.Exit(m.Run())
}

// proc is one client process: the unshare and sh in front of the worker
// share its process group, which the faults signal.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when the process has exited and its output is read
}

func (p *proc) signal(sig syscall.Signal) { _ = syscall.Kill(-p.cmd.Process.Pid, sig) }

// host is one client host.
type host struct {
	i     int
	gen   int // how many processes it has had
	proc  *proc
	clock time.Duration // its injected clock's offset
	proxy *toxiproxy.Proxy
}

// harness is one run.
type harness struct {
	t     *testing.T
	pid   int
	srv   *pgserver.Server
	port  string
	hosts []*host
	logs  string // the directory of the hosts' stderr

	mu      sync.Mutex
	history []Event
}

func (h *harness) add(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.history = append(h.history, e)
}

func (h *harness) events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.history...)
}

// start starts a new process on host c, as a new owner.
func (h *harness) start(c *host) {
	h.t.Helper()
	c.gen++
	dsn := fmt.Sprintf("postgres://postgres@%s:%s/hosts?sslmode=disable&connect_timeout=5", rootAddr(h.pid, c.i), h.port)
	cmd := exec.Command("ip", "netns", "exec", nsName(h.pid, c.i),
		"unshare", "--uts", "--pid", "--fork", "--mount-proc",
		"sh", "-c", `hostname "$1" && shift && "$@"`, "sh", hostName(c.i), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWorker+"=1", envDSN+"="+dsn, envHost+"="+hostName(c.i), envOwner+"="+ownerName(c.i, c.gen))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := os.OpenFile(filepath.Join(h.logs, hostName(c.i)+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(h.t, err)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(h.t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(h.t, err)
	require.NoError(h.t, cmd.Start())
	p := &proc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer stderr.Close()
		in := bufio.NewScanner(stdout)
		in.Buffer(nil, 1<<20)
		for in.Scan() {
			var e Event
			if json.Unmarshal(in.Bytes(), &e) == nil { // a process killed mid-line leaves half a line
				h.add(e)
			}
		}
		_ = cmd.Wait()
	}()
	c.proc = p
	if c.clock != 0 {
		fmt.Fprintf(p.stdin, "clock %s\n", c.clock)
	}
}

// stopAll asks every process to stop, and kills those that do not within
// the bound.
func (h *harness) stopAll(bound time.Duration) {
	for _, c := range h.hosts {
		if c.proc != nil {
			c.proc.signal(syscall.SIGCONT)
			fmt.Fprintln(c.proc.stdin, "stop")
		}
	}
	giveUp := time.After(bound)
	for _, c := range h.hosts {
		if c.proc == nil {
			continue
		}
		select {
		case <-c.proc.done:
		case <-giveUp:
			h.t.Errorf("%s did not stop within %v: killed", hostName(c.i), bound)
			c.proc.signal(syscall.SIGKILL)
			<-c.proc.done
		}
	}
}

// killAll is the cleanup's: every process of the run, at once.
func (h *harness) killAll() {
	for _, c := range h.hosts {
		if c.proc != nil {
			c.proc.signal(syscall.SIGKILL)
			c.proc.signal(syscall.SIGCONT)
		}
	}
	for _, c := range h.hosts {
		if c.proc != nil {
			<-c.proc.done
		}
	}
}

func duration() (time.Duration, bool) {
	if d, err := time.ParseDuration(os.Getenv(envDuration)); err == nil && d > 0 {
		return d, d <= shortDuration
	}
	return shortDuration, true
}

func seed() uint64 {
	if s, err := strconv.ParseUint(os.Getenv(envSeed), 10, 64); err == nil {
		return s
	}
	return uint64(time.Now().UnixNano())
}

func TestHosts(t *testing.T) {
	requireHosts(t)
	removeLeftovers(t)
	dur, short := duration()
	sd := seed()
	t.Logf("seed %d (replay with %s=%d), %v, %d hosts", sd, envSeed, sd, dur, nHosts)

	srv := pgserver.Start(t)
	dsn := srv.CreateDatabase("hosts")
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	h := &harness{t: t, pid: os.Getpid(), srv: srv, port: u.Port(), logs: t.TempDir()}
	require.NoError(t, os.WriteFile(stateFile(h.pid), []byte(filepath.Dir(srv.LogFile())), 0o600))

	// From here on, whatever happens, nothing of the run is left behind:
	// the cleanup on every exit of the test, the signal handler on an
	// interrupt (which skips the cleanups), the next run's removeLeftovers
	// after a SIGKILL.
	cleanup := sync.OnceFunc(func() {
		h.killAll()
		for _, c := range h.hosts {
			if c.proxy != nil {
				c.proxy.Stop()
			}
		}
		if err := removeHosts(h.pid); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	t.Cleanup(cleanup)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	stopSigs := make(chan struct{})
	t.Cleanup(func() { signal.Stop(sigs); close(stopSigs) })
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "tests/hosts: %v: removing the hosts, their namespaces and the server\n", s)
			cleanup()
			os.Exit(1)
		case <-stopSigs:
		}
	}()

	srv.Exec("hosts",
		`CREATE TABLE plans (id TEXT PRIMARY KEY, counter BIGINT NOT NULL, token BIGINT NOT NULL)`,
		`CREATE TABLE writes (id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, resource TEXT NOT NULL, token BIGINT NOT NULL,
			owner TEXT NOT NULL, attempt TEXT NOT NULL UNIQUE, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())`)
	for _, p := range plans {
		srv.Exec("hosts", fmt.Sprintf(`INSERT INTO plans VALUES ('%s', 0, 0)`, p))
	}
	c, err := locks.Open(context.Background(), locks.Config{Database: dsn}) // migrate once, before the hosts race
	require.NoError(t, err)
	require.NoError(t, c.Close())
	srv.Exec("hosts", changeLog...)
	srv.Exec("hosts", proofSchema...)

	proxies := newProxies()
	for i := 1; i <= nHosts; i++ {
		require.NoError(t, addHost(h.pid, i))
		hc := &host{i: i, clock: startClocks[(i-1)%len(startClocks)]}
		h.hosts = append(h.hosts, hc)
		hc.proxy = proxies.add(t, hostName(i), rootAddr(h.pid, i)+":"+h.port, "127.0.0.1:"+h.port)
		h.start(hc)
	}

	rng := rand.New(rand.NewPCG(sd, sd^0x9e3779b97f4a7c15))
	faults := schedule(rng, dur, short)
	begin := time.Now()
	seen, late := h.inject(begin, faults)
	if rest := begin.Add(dur + late).Sub(time.Now()); rest > 0 {
		time.Sleep(rest) // the quiet tail: the hosts work on, undisturbed, to show they recovered
	}
	end := time.Now()
	h.stopAll(30 * time.Second)

	tables := h.readTables()
	events := h.events()
	t.Logf("%d hosts, %v: %s", nHosts, end.Sub(begin).Round(time.Second), Summary(events))
	var skew, uncertainty time.Duration
	for _, e := range events {
		skew, uncertainty = max(skew, e.Skew.Abs()), max(uncertainty, e.Uncertainty)
	}
	t.Logf("the hosts' estimates of the server's time: off by at most %v, uncertain by at most %v (as their clocks said)",
		skew.Round(time.Microsecond), uncertainty.Round(time.Microsecond))
	vs := Check(events, tables, end, limits)
	for _, v := range vs {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	for _, v := range h.proveFaults(seen, events) {
		t.Errorf("%s: %s", v.Kind, v.Detail)
	}
	t.Logf("%d violations; %d rows, %d changes of the locks table, counters %v", len(vs), len(tables.Rows), len(tables.Changes), tables.Counters)
	for _, e := range events {
		if e.Kind == KindStarted {
			// Its sh is pid 1 of its namespace, hostname pid 2, the worker 3.
			require.Equal(t, fmt.Sprintf("hostname %s pid 3", e.Host), e.Err,
				"a host runs in UTS and PID namespaces of its own")
		}
	}
	if short {
		counts := map[string]int{}
		for _, e := range events {
			if e.Kind == KindFault {
				counts[e.Fault]++
			}
		}
		for _, f := range AllFaults {
			if counts[f] == 0 {
				t.Errorf("the short run injected no %s", f)
			}
		}
	}
	if name := os.Getenv(envHistory); name != "" {
		h.saveHistory(name, events)
	}
	if t.Failed() {
		h.saveHistory(filepath.Join(os.TempDir(), fmt.Sprintf("locks-hosts-history-%d.jsonl", h.pid)), events)
		for _, c := range h.hosts {
			b, _ := os.ReadFile(filepath.Join(h.logs, hostName(c.i)+".log"))
			t.Logf("%s's stderr:\n%s", hostName(c.i), b)
		}
	}
}

// readTables reads the writes and the counters, from the root namespace.
func (h *harness) readTables() Tables {
	db := h.srv.Open("hosts")
	tb := Tables{Counters: map[string]int64{}}
	rows, err := db.Query(`SELECT id, kind, resource, token, owner, attempt, at FROM writes`)
	require.NoError(h.t, err)
	defer rows.Close()
	for rows.Next() {
		var r Row
		require.NoError(h.t, rows.Scan(&r.ID, &r.Kind, &r.Resource, &r.Token, &r.Owner, &r.Attempt, &r.At))
		tb.Rows = append(tb.Rows, r)
	}
	require.NoError(h.t, rows.Err())
	prow, err := db.Query(`SELECT id, counter FROM plans`)
	require.NoError(h.t, err)
	defer prow.Close()
	for prow.Next() {
		var id string
		var n int64
		require.NoError(h.t, prow.Scan(&id, &n))
		tb.Counters["plan/"+id] = n
	}
	require.NoError(h.t, prow.Err())
	crow, err := db.Query(`SELECT id, op, resource, token, owner, acquired, expires, tx, at FROM lock_changes`)
	require.NoError(h.t, err)
	defer crow.Close()
	for crow.Next() {
		var c Change
		var acquired, expires string
		require.NoError(h.t, crow.Scan(&c.ID, &c.Op, &c.Resource, &c.Token, &c.Owner, &acquired, &expires, &c.Tx, &c.At))
		c.Acquired, err = time.Parse(time.RFC3339Nano, acquired)
		require.NoError(h.t, err, "change %d: the stored acquisition time", c.ID)
		c.Expires, err = time.Parse(time.RFC3339Nano, expires)
		require.NoError(h.t, err, "change %d: the stored expiry", c.ID)
		tb.Changes = append(tb.Changes, c)
	}
	require.NoError(h.t, crow.Err())
	return tb
}

// saveHistory keeps the history of a failed run, for reading after the
// test has removed its temporary directories.
func (h *harness) saveHistory(name string, events []Event) {
	f, err := os.Create(name)
	if err != nil {
		h.t.Logf("history not saved: %v", err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, e := range events {
		_ = enc.Encode(e)
	}
	h.t.Logf("the history is in %s", name)
}
