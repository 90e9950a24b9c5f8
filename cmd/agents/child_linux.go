package main

import (
	"os"
	"os/exec"
	"os/signal"
	"syscall"
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
type group struct {
	keeper *exec.Cmd
	// done is the keeper's stdin: 'd' then EOF when agents is done; EOF
	// alone when agents has died.
	done *os.File
	pgid int
}

// startGroup starts the keeper of a new process group.
func startGroup() (*group, error) {
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
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	return &group{keeper: cmd, done: w, pgid: cmd.Process.Pid}, nil
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
	_, _ = g.done.Write([]byte{'d'}) // fails if the keeper was killed with the group
	_ = g.done.Close()
	g.done = nil
	_ = g.keeper.Wait()
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

// keep is the keeper: it waits for agents to say it is done, or to die,
// and then kills the group, itself included. It ignores the signals that
// agents forwards to the group: they are for the command.
func keep() int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	var b [1]byte
	for {
		n, err := syscall.Read(0, b[:])
		if err == syscall.EINTR {
			continue
		}
		if n == 1 && b[0] == 'd' {
			return 0
		}
		break
	}
	_ = syscall.Kill(0, syscall.SIGKILL)
	return 1
}
