//go:build linux

package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stopNewKeeper SIGSTOPs the first keeper that is a child of this process,
// as soon as it shows in /proc, until stop is closed; it returns the pid.
func stopNewKeeper(stop <-chan struct{}) int {
	me := strconv.Itoa(os.Getpid())
	for {
		select {
		case <-stop:
			return 0
		default:
		}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err != nil {
				continue
			}
			argv, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || !bytes.HasPrefix(argv, []byte(keeperName)) {
				continue
			}
			stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			if len(f) > 1 && f[1] == me {
				pid, _ := strconv.Atoi(e.Name())
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				return pid
			}
		}
	}
}

// A keeper stopped while it starts (before it has said it is ready) must
// not hold agents up forever: startGroup fails, saying so, or (if the stop
// came just after the keeper was ready) returns a group whose guard is
// already lost. Either way it returns.
func TestStartGroup_KeeperStoppedBeforeReady(t *testing.T) {
	early := 0
	for range 10 {
		stop := make(chan struct{})
		stopped := make(chan int, 1)
		go func() { stopped <- stopNewKeeper(stop) }()
		type result struct {
			g   *group
			err error
		}
		res := make(chan result, 1)
		go func() { g, err := startGroup(nil); res <- result{g, err} }()
		var r result
		select {
		case r = <-res:
		case <-time.After(30 * time.Second): // a hang, not a speed goal
			close(stop)
			if pid := <-stopped; pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatal("startGroup is still waiting for a keeper stopped before it was ready")
		}
		close(stop)
		pid := <-stopped
		if r.err != nil {
			if !strings.Contains(r.err.Error(), "was stopped by SIGSTOP before it was ready") {
				t.Fatalf("startGroup: %v", r.err)
			}
			early++
			continue
		}
		if pid > 0 {
			guard, _ := r.g.guarded()
			<-guard // stopped after it was ready: the guard is lost
		}
		r.g.close()
	}
	t.Logf("%d of 10 keepers were stopped before they were ready", early)
}
