//go:build !linux

package main

import (
	"io"
	"os"
	"os/exec"
	"time"
)

// group is the process group of the command: only Linux has one here,
// with the keeper that stops it if agents dies. Elsewhere the command runs
// in agents' group, and is signalled alone.
type group struct{}

// startGroup starts no group.
func startGroup(io.Reader) (*group, error) { return nil, nil }

// id returns 0: there is no group.
func (g *group) id() int { return 0 }

// foreground does nothing: there is no group.
func (g *group) foreground() {}

// close does nothing.
func (g *group) close() {}

// guarded returns no channel: there is no keeper to lose.
func (g *group) guarded() (<-chan struct{}, func() string) { return nil, nil }

// lease does nothing: there is no keeper to enforce it.
func (g *group) lease(func() time.Duration, time.Duration, time.Duration) {}

// lapsedc returns no channel: there is no keeper to stop the group.
func (g *group) lapsedc() <-chan struct{} { return nil }

// mark does nothing: there is no keeper to compare with.
func (g *group) mark() {}

// keeperKillIn returns grace: there is no keeper to stop the group.
func (g *group) keeperKillIn(grace time.Duration) time.Duration { return grace }

// keeperFirst reports false: there is no keeper to stop the group.
func (g *group) keeperFirst() bool { return false }

// busy reports false: there is no group to outlive the command.
func (g *group) busy() bool { return false }

// killMembers does nothing: there is no group.
func (g *group) killMembers() {}

// reap does nothing: there is no group.
func (g *group) reap() {}

// signal sends sig to the command.
func (p *child) signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// protectChild does nothing: only Linux has a parent-death signal. If
// agents dies without stopping it (kill -9), the command goes on running
// while its lock expires; docs/cli.md says so.
func protectChild(cmd *exec.Cmd, g *group) {}
