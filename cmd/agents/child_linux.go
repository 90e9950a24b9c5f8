package main

import (
	"os/exec"
	"syscall"
)

// parentDeathSignal is the signal the command of "locks run" gets if
// agents dies without stopping it (kill -9, the OOM killer): nobody renews
// the lock any more, so the command must not go on unprotected. SIGKILL
// rather than SIGTERM, since nobody would enforce a grace period either.
const parentDeathSignal = syscall.SIGKILL

// protectChild gives the command the parent-death signal.
func protectChild(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: parentDeathSignal}
}
