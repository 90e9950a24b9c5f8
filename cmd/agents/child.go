package main

import (
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
)

// child is the command that "locks run" runs.
type child struct {
	cmd *exec.Cmd
	// done receives the result of Wait once the command has ended.
	done chan error
	// reported is set once the loss of the lock has been reported.
	reported bool
	// unguarded says why the group was killed when its keeper died or was
	// stopped; empty if it was not.
	unguarded string
	// lapsed says why the keeper stopped the group, having heard of no
	// renewal of the lock before its expiry; empty if it did not.
	lapsed string
	// killedGroup is set once agents itself has sent SIGKILL to the whole
	// group, the keeper with it (a command still running --grace after
	// SIGTERM): the keeper's death that follows is agents' own doing.
	killedGroup bool
	// group is the process group the command runs in; nil for agents'.
	group *group
}

// startChild starts cmd, and waits for it in a goroutine locked to the OS
// thread that started it. On Linux the command gets a parent-death signal
// (see protectChild), which the kernel sends when the thread that created
// the command exits, not the process: were that goroutine's thread to end
// while the command runs, the command would be killed, and while it is
// locked to the goroutine the runtime never ends it.
func startChild(cmd *exec.Cmd, g *group) (*child, error) {
	protectChild(cmd, g)
	p := &child{cmd: cmd, done: make(chan error, 1), group: g}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// terminate asks the command, and every process of its group, to stop.
func (p *child) terminate() error { return p.signal(syscall.SIGTERM) }

// kill stops the command, and every process of its group.
func (p *child) kill() error { return p.signal(syscall.SIGKILL) }

// result is how the command ended, once it has: its exit code, or 128+N
// when signal N killed it, as a shell reports it.
func (p *child) result() commandDoc {
	ps := p.cmd.ProcessState
	doc := commandDoc{PID: p.cmd.Process.Pid, ExitCode: ps.ExitCode()}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		n := int(ws.Signal())
		doc.ExitCode, doc.Signal = 128+n, &n
	}
	return doc
}

// notifySignals is Main.Signals of the agents process: SIGINT, SIGTERM
// and SIGHUP, which "locks run" forwards to its command.
func notifySignals(c chan<- os.Signal) (stop func()) {
	signal.Notify(c, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	return func() { signal.Stop(c) }
}
