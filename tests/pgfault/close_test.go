//go:build linux

package pgfault

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/tests/pgserver"
)

// A store whose server has stopped answering (SIGSTOPped: its sockets
// stay open, nothing replies) closes within a bound that does not grow
// with its pool: each connection's graceful close waits for the server
// (pgx deallocates every prepared statement, with 5 s to answer), so a
// pool of 8 once took 43 s.
func TestFault_CloseOnASilentServer(t *testing.T) {
	s := pgserver.Start(t)
	dsn := s.CreateDatabase("locks")
	ctx := context.Background()
	db, err := postgres.Open(ctx, dsn, postgres.Options{MaxConns: 8})
	require.NoError(t, err)
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0, application.WithWakeups(db.Wakeups()))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 16 { // enough at once to open every connection of the pool
		wg.Go(func() {
			for i := range 30 {
				owner, ref := fmt.Sprint("o", g), plan(fmt.Sprint(g, "-", i%3))
				if _, err := svc.Acquire(ctx, owner, ref, time.Minute); err == nil {
					_, _ = svc.Get(ctx, ref)
					_, _ = svc.Release(ctx, owner, ref)
				}
			}
		})
	}
	wg.Wait()
	_, stop := db.Wakeups().Watch(plan("watched")) // the listener is up, and has said something
	defer stop()

	server := processes(t, s)
	signal(server, syscall.SIGSTOP)
	defer signal(server, syscall.SIGCONT)
	closeSilent(t, db, server, "Close against a silent server")
}

// closeSilent closes db, whose server processes are stopped, and fails
// unless Close returns in well under call; what names the case.
func closeSilent(t *testing.T, db *postgres.DB, server []int, what string) {
	t.Helper()
	began := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	select {
	case <-closed:
		took := time.Since(began)
		t.Logf("Close took %s", took)
		require.Less(t, took, 12*time.Second, what)
	case <-time.After(call):
		signal(server, syscall.SIGCONT)
		<-closed
		t.Fatalf("%s took more than %s", what, call)
	}
}

// The same with calls in flight that have no deadline, on a pool of one:
// the calls waiting for a connection get new ones dialed, which stall in
// their startup handshake, and Close once waited on them for ever. Every
// call returns (with an error) once Close has cut the connections.
func TestFault_CloseOnASilentServerWithCallsInFlight(t *testing.T) {
	s := pgserver.Start(t)
	dsn := s.CreateDatabase("locks")
	ctx := context.Background()
	db, err := postgres.Open(ctx, dsn, postgres.Options{MaxConns: 1})
	require.NoError(t, err)
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0, application.WithWakeups(db.Wakeups()))
	require.NoError(t, err)
	var (
		wg      sync.WaitGroup
		stopped = make(chan struct{})
		cycles  atomic.Int64
	)
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopped:
					return
				default:
				}
				owner, ref := fmt.Sprint("o", g), plan(fmt.Sprint(g%5, "-", i%3))
				if _, err := svc.Acquire(ctx, owner, ref, time.Minute); err == nil {
					_, _ = svc.Get(ctx, ref)
					_, _ = svc.Release(ctx, owner, ref)
				}
				cycles.Add(1)
			}
		})
	}
	require.Eventually(t, func() bool { return cycles.Load() > 500 }, call, time.Millisecond, "the calls never ran")
	server := processes(t, s)
	signal(server, syscall.SIGSTOP)
	defer signal(server, syscall.SIGCONT)
	close(stopped)
	// Let the calls that were on their way, and those that dial for the
	// one connection, get stuck on the server: nothing to wait for but
	// the scheduler.
	time.Sleep(200 * time.Millisecond)
	closeSilent(t, db, server, "Close against a silent server, with calls in flight")
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(call):
		t.Fatal("calls in flight still wait on the silent server after Close")
	}
}

// processes returns the pids of s's postmaster and of its children (from
// /proc: each process's parent is the fourth field of its stat).
func processes(t *testing.T, s *pgserver.Server) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(s.LogFile()), "data", "postmaster.pid"))
	require.NoError(t, err)
	pm, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	require.NoError(t, err)
	pids := []int{pm}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	require.NoError(t, err)
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the process has gone
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut after
		// its closing parenthesis.
		i := strings.LastIndexByte(string(b), ')')
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pm) {
			p, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, p)
		}
	}
	require.Greater(t, len(pids), 1, "no children of the postmaster %d", pm)
	return pids
}

func signal(pids []int, sig syscall.Signal) {
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
}
