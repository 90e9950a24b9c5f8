//go:build !linux

package main

import "os/exec"

// protectChild does nothing: only Linux has a parent-death signal. If
// agents dies without stopping it (kill -9), the command goes on running
// while its lock expires; docs/cli.md says so.
func protectChild(cmd *exec.Cmd) {}
