package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// parentDeathSignal is the signal the command of "locks run" gets if
// agents dies without stopping it (kill -9, the OOM killer): nobody renews
// the lock any more, so the command must not go on unprotected. SIGKILL
// rather than SIGTERM, since nobody would enforce a grace period either.
const parentDeathSignal = syscall.SIGKILL

// keeperName is the argv[0] with which agents runs itself as the keeper of
// a command's process group (see startGroup). No one types it: it names
// the process in ps.
const keeperName = "agents: keeper of a locks run process group"

func init() {
	// Before anything else: the keeper is agents' own binary, or the test
	// binary of this package, run again.
	if len(os.Args) == 1 && os.Args[0] == keeperName {
		os.Exit(keep())
	}
}

// group is the process group in which "locks run" runs its command: the
// work that the lock guards is the command and every process it starts,
// and they are signalled, stopped and proven gone as a whole.
//
// The group must exist before the lock is taken, since the owner id names
// it (domain.ProcessOwner.Group), and the command may start only once the
// lock is held. So a keeper process opens it: agents runs itself again,
// in a new process group, and the command joins that group once the lock
// is held. The keeper then watches agents through a pipe: if agents dies
// (SIGKILL, the OOM killer) without saying it is done, the keeper kills
// the whole group, so that no process of the work runs on unprotected.
//
// In a terminal in which agents is the foreground job, the group takes
// the terminal over while the command runs (a background group that reads
// it would be stopped by SIGTTIN), and agents takes it back when the
// command ends. Ctrl-Z then stops the command's group, and the keeper
// stops agents too, so that the shell gets the terminal back; when the
// shell continues agents in the foreground (fg), agents gives the
// terminal to the group again and continues it.
type group struct {
	keeper *exec.Cmd
	// done is the keeper's stdin: leases and beats (see keep), then 'd'
	// and EOF when agents is done; EOF alone when agents has died.
	done *os.File
	pgid int
	// tty is the terminal the group has taken over; nil for none.
	tty *os.File
	// conts receives SIGCONT while the group has the terminal, until
	// close stops it; resumed is closed once it has stopped.
	conts   chan os.Signal
	resumed sync.WaitGroup
	// fg is set once the group may have the terminal (foreground).
	mu sync.Mutex
	fg bool
	// guard is closed the first time the keeper dies or is stopped (see
	// watch); guardWhy says which. exited is closed once it has been
	// reaped, and stops receives each stop.
	guard    chan struct{}
	guardWhy string
	exited   chan struct{}
	stops    chan struct{}
	// lapsed is closed once the keeper says it stopped the group because
	// the lease ran out (see keep), at lapsedAt, and will SIGKILL what is
	// left at lapsedKill; heard is closed once the keeper's stdout has
	// ended, so that close knows all it said. stoppedAt is when agents
	// stopped the group itself (mark). All are CLOCK_BOOTTIME, under mu.
	lapsed     chan struct{}
	heard      chan struct{}
	lapsedAt   int64
	lapsedKill int64
	stoppedAt  int64
	// leases holds the lease not yet written (see lease); nil once close
	// has begun. beating says the writer runs; stopWrite stops it, and
	// writing waits for it. beat is the writer's heartbeat.
	leases    chan [leaseLen]byte
	beating   bool
	stopWrite chan struct{}
	writing   sync.WaitGroup
	beat      time.Duration
}

// startGroup starts the keeper of a new process group. If in is a
// terminal in which agents' process group is in the foreground, the new
// group takes it over.
func startGroup(in io.Reader) (*group, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{keeperName}
	cmd.Stdin = r
	// No parent-death signal: the keeper must outlive agents to stop the
	// group, and learns of its death from the pipe instead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The group gets the terminal only once the command has joined it
	// (see foreground): until then a Ctrl-C or Ctrl-Z must reach agents,
	// not a keeper that ignores it and a group with nobody else in it.
	tty := foregroundTerminal(in)
	if tty != nil {
		cmd.Env = append(os.Environ(), keeperForeground+"=1")
	}
	// The keeper says when it ignores the signals meant for the command:
	// until then a Ctrl-C to the group would kill it, and with it the
	// group's guard.
	ready, readyW, err := os.Pipe()
	if err != nil {
		w.Close()
		return nil, err
	}
	cmd.Stdout = readyW
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		ready.Close()
		w.Close()
		return nil, err
	}
	g := &group{keeper: cmd, done: w, pgid: cmd.Process.Pid, tty: tty,
		guard: make(chan struct{}), exited: make(chan struct{}), stops: make(chan struct{}, 1),
		lapsed: make(chan struct{}), heard: make(chan struct{}),
		leases: make(chan [leaseLen]byte, 1), stopWrite: make(chan struct{}), beat: heartbeat}
	// Watched from the start: a keeper stopped (or killed) before it is
	// ready would never say so, and agents must not wait for it forever.
	go g.watch()
	readyc := make(chan bool, 1)
	go g.hear(ready, readyc)
	ok := false
	select {
	case ok = <-readyc:
	case <-g.guard:
	}
	if !ok {
		w.Close()
		_ = cmd.Process.Kill() // a stopped keeper dies too
		<-g.exited
		err := fmt.Errorf("the keeper of the process group %s before it was ready", g.guardWhy)
		if g.guardWhy == "was killed by SIGINT" || g.guardWhy == "was killed by SIGHUP" {
			// A Ctrl-C (or a terminal's hangup) that reached the keeper in
			// the instant after its fork, before it left agents' process
			// group: the user's interrupt, not a failure to start.
			err = fmt.Errorf("%w: %v", context.Canceled, err)
		}
		return nil, err
	}
	if tty != nil {
		g.conts = make(chan os.Signal, 1)
		signal.Notify(g.conts, syscall.SIGCONT)
		g.resumed.Add(1)
		go g.resume()
	}
	return g, nil
}

// keeperForeground tells the keeper that its group has the terminal.
const keeperForeground = "AGENTS_KEEPER_FOREGROUND"

// foregroundTerminal returns in if it is a terminal whose foreground
// process group is agents' own, and nil otherwise.
func foregroundTerminal(in io.Reader) *os.File {
	f, ok := in.(*os.File)
	if !ok {
		return nil
	}
	if pgrp, err := tcgetpgrp(f); err != nil || pgrp != syscall.Getpgrp() {
		return nil
	}
	return f
}

func tcgetpgrp(f *os.File) (int, error) {
	var pgrp int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); errno != 0 {
		return 0, errno
	}
	return int(pgrp), nil
}

// tcsetpgrp puts process group pgrp in the foreground of terminal f. From
// a background group this needs SIGTTOU ignored, or the kernel stops the
// caller instead.
func tcsetpgrp(f *os.File, pgrp int) error {
	p := int32(pgrp)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&p))); errno != 0 {
		return errno
	}
	return nil
}

// foreground gives the terminal to the group, now that the command has
// joined it, if agents is still in its foreground. A command that read or
// wrote the terminal meanwhile was stopped for it (SIGTTIN, SIGTTOU), and
// is continued. A Ctrl-C typed before this reached agents, which forwards
// it to the group.
func (g *group) foreground() {
	if g == nil || g.tty == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fg = true
	if pgrp, err := tcgetpgrp(g.tty); err == nil && pgrp == syscall.Getpgrp() {
		_ = tcsetpgrp(g.tty, g.pgid)
		_ = syscall.Kill(-g.pgid, syscall.SIGCONT)
	}
}

// resume continues the group each time agents is continued (after the
// keeper stopped it on Ctrl-Z): in the foreground (fg), the group gets the
// terminal back first; in the background (bg), it runs on without it.
// Before the command has joined the group, the terminal stays agents'.
func (g *group) resume() {
	defer g.resumed.Done()
	for range g.conts {
		g.mu.Lock()
		fg := g.fg
		g.mu.Unlock()
		if !fg {
			continue
		}
		if pgrp, err := tcgetpgrp(g.tty); err == nil && pgrp == syscall.Getpgrp() {
			_ = tcsetpgrp(g.tty, g.pgid)
		}
		_ = syscall.Kill(-g.pgid, syscall.SIGCONT)
	}
}

// id returns the group's process group id; 0 for none.
func (g *group) id() int {
	if g == nil {
		return 0
	}
	return g.pgid
}

// close tells the keeper that agents is done and waits for it to exit.
// The processes that the command left running in the group go on. It may
// be called more than once.
func (g *group) close() {
	if g == nil || g.done == nil {
		return
	}
	g.mu.Lock()
	g.leases = nil // no lease after this
	g.mu.Unlock()
	close(g.stopWrite)
	// The writer may still be writing a beat: each message is written
	// whole, and the keeper reads nothing after 'd'. Closing the pipe
	// ends a write that blocks on a stopped keeper.
	_, _ = g.done.Write([]byte{msgDone}) // fails if the keeper was killed with the group
	_ = g.done.Close()
	g.writing.Wait()
	g.done = nil
	// A stopped keeper would never read it: it has no group left to
	// guard, so it is killed alone.
	select {
	case <-g.exited:
	case <-g.stops:
		_ = syscall.Kill(g.pgid, syscall.SIGKILL)
		<-g.exited
	}
	<-g.heard
	if g.tty == nil {
		return
	}
	signal.Stop(g.conts)
	close(g.conts)
	g.resumed.Wait()
	// Take the terminal back, unless someone else has it by now (the
	// shell, after a Ctrl-Z and bg).
	if pgrp, err := tcgetpgrp(g.tty); err == nil && pgrp == g.pgid {
		signal.Ignore(syscall.SIGTTOU)
		_ = tcsetpgrp(g.tty, syscall.Getpgrp())
		signal.Reset(syscall.SIGTTOU)
	}
}

// watch waits for the keeper (reaping it in place of exec.Cmd.Wait, which
// cannot report a stop): the keeper is the only thing that kills the group
// should agents die, so the moment it dies or is stopped (SIGSTOP, which
// no process can ignore) the group has lost its guard, and guard says so.
func (g *group) watch() {
	defer close(g.exited)
	defer g.keeper.Process.Release() // reaped here: exec.Cmd.Wait is never called
	lose := func(why string) {
		select {
		case <-g.guard:
		default:
			g.guardWhy = why
			close(g.guard)
		}
	}
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(g.pgid, &ws, syscall.WUNTRACED, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			lose("cannot be waited for: " + err.Error())
			return
		case ws.Stopped():
			lose("was stopped by " + unix.SignalName(ws.StopSignal()))
			select {
			case g.stops <- struct{}{}:
			default:
			}
			continue
		case ws.Signaled():
			lose("was killed by " + unix.SignalName(ws.Signal())) // "by SIGKILL"
		default:
			lose(fmt.Sprintf("exited (status %d)", ws.ExitStatus()))
		}
		return
	}
}

// guarded returns a channel that is closed once the keeper has died or
// been stopped, and why, after it is closed.
func (g *group) guarded() (<-chan struct{}, func() string) {
	if g == nil {
		return nil, nil
	}
	return g.guard, func() string { <-g.guard; return g.guardWhy }
}

// reap kills every process that is left in the group, until none is (or
// a few seconds have passed: a zombie that nobody reaps does no work).
// It is what agents does when the keeper can no longer do it.
func (g *group) reap() {
	if g == nil {
		return
	}
	for range 500 {
		if err := syscall.Kill(-g.pgid, syscall.SIGKILL); err == syscall.ESRCH {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// busy reports whether a process of the group other than the keeper still
// runs: a zombie does no work, and is not counted.
func (g *group) busy() bool { return g != nil && len(g.members()) > 0 }

// killMembers SIGKILLs every process of the group but the keeper, which
// must outlive them to guard them should agents die meanwhile.
func (g *group) killMembers() {
	if g == nil {
		return
	}
	for _, pid := range g.members() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// members lists the live processes of the group other than the keeper.
func (g *group) members() []int { return groupMembers(g.pgid) }

// lapsedc returns a channel that is closed once the keeper has stopped the
// group because it heard of no renewal before the lock's expiry.
func (g *group) lapsedc() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.lapsed
}

// groupMembers lists the live processes of process group pgid other than
// its leader (the keeper), as /proc shows them. No signal can ask "is
// anyone but the keeper there": kill(-pgid, 0) counts the keeper too.
func groupMembers(pgid int) []int {
	if err := syscall.Kill(-pgid, 0); err == syscall.ESRCH {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pgid {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold anything, so the
		// fields are read after its last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if pgrp, err := strconv.Atoi(f[2]); err == nil && pgrp == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// signal sends sig to every process of the group, or to the command alone
// if there is no group.
func (p *child) signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if p.group == nil || !ok {
		return p.cmd.Process.Signal(sig)
	}
	return syscall.Kill(-p.group.pgid, s)
}

// protectChild gives the command the parent-death signal, and puts it in
// its group.
func protectChild(cmd *exec.Cmd, g *group) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: parentDeathSignal}
	if g != nil {
		cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pgid = true, g.pgid
	}
}
