//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The worker side of the hand-over cases. A hand-over worker holds one
// lock implementation open and obeys its parent line by line:
//
//	take     answers "waiting <attempts>" at once, then, when the lock is
//	         taken, "got <CLOCK_MONOTONIC ns> <attempts> <try ns>", try
//	         being how long the try that took it lasted (-1: not known);
//	         it takes in the background, so that "stats" is answered
//	         meanwhile
//	release  answers "released <before> <after>", CLOCK_MONOTONIC ns as
//	         the release was called and as it returned
//	stats    answers "stats <attempts> <CPU ns>": the acquire attempts so
//	         far (-1: not counted) and the process's user+system time
//
// and ends at the end of its input. A failure answers "error <why>".

// monoNow reads CLOCK_MONOTONIC, which every process of the machine
// shares, in nanoseconds.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // CLOCK_MONOTONIC is always there on Linux
	}
	return ts.Nano()
}

// cpuTime is this process's user and system time.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// handoverRef is the resource the hand-over workers pass between them.
var handoverRef = domain.ResourceRef{Type: domain.ResourcePlan, ID: "handover"}

// handoverLocker is one lock implementation as a hand-over worker uses it.
type handoverLocker interface {
	take(ctx context.Context) error // waits while the other worker holds it
	release(ctx context.Context) error
	attempts() int64 // acquire attempts so far; -1: not counted
	lastTry() int64  // how long the try that took the lock lasted, ns; -1: not known
	close()
}

func handoverWorkerMain(mode string, stdin io.Reader, stdout io.Writer) int {
	switch mode {
	case stampMode:
		return stampMain(os.Args[1:])
	case fairMode:
		return fairMain(stdin, stdout)
	case fifoMode:
		return fifoMain(os.Getenv(workerDBEnv), os.Getenv(workerIDEnv), stdin, stdout)
	}
	ctx := context.Background()
	lk, err := openHandoverLocker(ctx, mode, os.Getenv(workerDBEnv), "bench-handover-"+os.Getenv(workerIDEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "hand-over worker:", err)
		return 1
	}
	defer lk.close()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stdout, format+"\n", args...)
	}
	say("ready")
	in := bufio.NewScanner(stdin)
	for in.Scan() {
		switch cmd := in.Text(); cmd {
		case "take":
			say("waiting %d", lk.attempts())
			go func() {
				err := lk.take(ctx)
				t := monoNow()
				if err != nil {
					say("error take: %s", oneLine(err.Error()))
					return
				}
				say("got %d %d %d", t, lk.attempts(), lk.lastTry())
			}()
		case "release":
			t0 := monoNow()
			err := lk.release(ctx)
			t := monoNow()
			if err != nil {
				say("error release: %s", oneLine(err.Error()))
				continue
			}
			say("released %d %d", t0, t)
		case "stats":
			say("stats %d %d", lk.attempts(), cpuTime().Nanoseconds())
		default:
			say("error unknown command %q", cmd)
		}
	}
	return 0
}

func openHandoverLocker(ctx context.Context, mode, target, owner string) (handoverLocker, error) {
	switch mode {
	case "handover-module":
		return openModuleLocker(ctx, target, owner)
	case "handover-flock":
		f, err := os.OpenFile(target, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		return &flockLocker{f: f}, nil
	case "handover-advisory":
		conn, err := pgx.Connect(ctx, target)
		if err != nil {
			return nil, err
		}
		// Both workers are children of the bench, whose pid is the class
		// of its advisory locks.
		return &advisoryLocker{conn: conn, class: int32(os.Getppid())}, nil
	}
	return nil, errors.New("unknown hand-over worker mode " + mode)
}

// moduleLocker is the module, as an application embeds it: Take with
// Wait, then Handle.Release. It learns of its tries through the module's
// log of events: each try of a waiting Take that finds the lock held is
// a "refused" event, and the one that takes it an "acquired" event that
// says how long it took.
type moduleLocker struct {
	c      *locks.Container
	owner  string
	events *tries
	mu     sync.Mutex
	h      *application.Handle
}

func openModuleLocker(ctx context.Context, database, owner string) (*moduleLocker, error) {
	t := &tries{}
	c, err := locks.Open(ctx, locks.Config{Database: database, Owner: owner, Logger: slog.New(t)})
	if err != nil {
		return nil, err
	}
	return &moduleLocker{c: c, owner: owner, events: t}, nil
}

func (m *moduleLocker) take(ctx context.Context) error {
	h, err := m.c.Locks.Take(ctx, m.owner, handoverRef, application.AcquireOptions{Wait: true, TTL: lockTTL})
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.h = h
	m.mu.Unlock()
	return nil
}

func (m *moduleLocker) release(ctx context.Context) error {
	m.mu.Lock()
	h := m.h
	m.h = nil
	m.mu.Unlock()
	if h == nil {
		return errors.New("release without a lock")
	}
	return released(h.Release(ctx))
}

func (m *moduleLocker) attempts() int64 { return m.events.refused.Load() }
func (m *moduleLocker) lastTry() int64  { return m.events.took.Load() }
func (m *moduleLocker) close()          { _ = m.c.Close() }

// tries is a slog.Handler that only counts the module's "lock refused"
// events and keeps how long the last acquisition took.
type tries struct{ refused, took atomic.Int64 }

var (
	refusedEvent  = "lock " + application.EventRefused.String()
	acquiredEvent = "lock " + application.EventAcquired.String()
)

func (t *tries) Enabled(context.Context, slog.Level) bool { return true }
func (t *tries) Handle(_ context.Context, rec slog.Record) error {
	switch rec.Message {
	case refusedEvent:
		t.refused.Add(1)
	case acquiredEvent:
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "took" {
				t.took.Store(a.Value.Duration().Nanoseconds())
			}
			return a.Key != "took"
		})
	}
	return nil
}
func (t *tries) WithAttrs([]slog.Attr) slog.Handler { return t }
func (t *tries) WithGroup(string) slog.Handler      { return t }

// flockLocker is flock(2) on a file of its own: the kernel queues the
// waiter and wakes it at the unlock.
type flockLocker struct{ f *os.File }

func (l *flockLocker) take(context.Context) error {
	for {
		if err := unix.Flock(int(l.f.Fd()), unix.LOCK_EX); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func (l *flockLocker) release(context.Context) error { return unix.Flock(int(l.f.Fd()), unix.LOCK_UN) }
func (l *flockLocker) attempts() int64               { return -1 }
func (l *flockLocker) lastTry() int64                { return -1 }
func (l *flockLocker) close()                        { _ = l.f.Close() }

// advisoryLocker is PostgreSQL's session advisory lock on a connection of
// its own: the waiter blocks in pg_advisory_lock, in the server's queue.
type advisoryLocker struct {
	conn  *pgx.Conn
	class int32
}

const handoverKey = -2 // the one-resource scenario's key is -1

func (l *advisoryLocker) take(ctx context.Context) error {
	_, err := l.conn.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", l.class, int32(handoverKey))
	return err
}

func (l *advisoryLocker) release(ctx context.Context) error {
	var ok bool
	if err := l.conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", l.class, int32(handoverKey)).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("the advisory lock was not held at its release")
	}
	return nil
}

func (l *advisoryLocker) attempts() int64 { return -1 }
func (l *advisoryLocker) lastTry() int64  { return -1 }
func (l *advisoryLocker) close()          { _ = l.conn.Close(context.Background()) }

// stampMain is the command the CLI cases run: "<hold> <path>" writes
// CLOCK_MONOTONIC to path.start as it starts, sleeps hold, and writes it
// to path.end.
func stampMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "stamp: expected HOLD PATH")
		return 2
	}
	start := monoNow()
	hold, err := time.ParseDuration(args[0])
	if err == nil {
		err = writeStamp(args[1]+".start", start)
	}
	if err == nil {
		time.Sleep(hold)
		err = writeStamp(args[1]+".end", monoNow())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stamp:", err)
		return 1
	}
	return 0
}

// writeStamp writes t to path whole: through a file renamed into place,
// so that a reader never sees it half written.
func writeStamp(path string, t int64) error {
	if err := os.WriteFile(path+".tmp", fmt.Appendf(nil, "%d\n", t), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// fairRef is the resource the fairness workers cycle.
var fairRef = domain.ResourceRef{Type: domain.ResourcePlan, ID: "fair"}

// fairMain is a fairness worker, in runWorkers's protocol: fairWaiters
// goroutines, each its own owner, cycle fairRef (Take with Wait, hold
// fairHold, Release) until the time is up, and the report says how many
// grants each got.
func fairMain(stdin io.Reader, stdout io.Writer) int {
	ctx := context.Background()
	id := os.Getenv(workerIDEnv)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(workerDBEnv), Owner: "bench-fair-" + id})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fairness worker:", err)
		return 1
	}
	defer c.Close()
	opts := application.AcquireOptions{Wait: true, TTL: lockTTL}
	warm := domain.ResourceRef{Type: domain.ResourcePlan, ID: "fair-warm-" + id}
	h, err := c.Locks.Take(ctx, "bench-fair-"+id, warm, opts)
	if err == nil {
		err = released(h.Release(ctx))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fairness worker: warm-up:", err)
		return 1
	}
	fmt.Fprintln(stdout, "ready")
	d, err := readGo(stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fairness worker:", err)
		return 1
	}
	start := time.Now()
	until, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		grants = make([]int, fairWaiters)
	)
	for g := range grants {
		owner := fmt.Sprintf("bench-fair-%s-%d", id, g)
		wg.Go(func() {
			for until.Err() == nil {
				h, err := c.Locks.Take(until, owner, fairRef, opts)
				if err == nil {
					time.Sleep(fairHold)
					err = released(h.Release(ctx))
				}
				if err != nil {
					if until.Err() == nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					return
				}
				grants[g]++
			}
		})
	}
	wg.Wait()
	rep := workerReport{Grants: grants, ElapsedNS: time.Since(start).Nanoseconds()}
	if err := errors.Join(errs...); err != nil {
		rep.Fatal = oneLine(err.Error())
	}
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		return 1
	}
	return 0
}

// readGo reads runWorkers's "go <nanoseconds>".
func readGo(stdin io.Reader) (time.Duration, error) {
	line, err := bufio.NewReader(stdin).ReadString('\n')
	var ns int64
	if err == nil {
		_, err = fmt.Sscanf(strings.TrimSpace(line), "go %d", &ns)
	}
	if err != nil {
		return 0, fmt.Errorf("expected \"go <nanoseconds>\", read %q: %w", line, err)
	}
	return time.Duration(ns), nil
}
