//go:build !linux

package main

import (
	"context"
	"fmt"
	"io"
	"os"
)

// The hand-over cases read CLOCK_MONOTONIC in several processes and lock
// files with flock(2): Linux only, for now.

func runHandover(context.Context, *environment, []contender, options) (*handoverReport, error) {
	return &handoverReport{skipped: []string{"hand-over between processes skipped: it runs on Linux only"}}, nil
}

func handoverWorkerMain(mode string, _ io.Reader, _ io.Writer) int {
	fmt.Fprintf(os.Stderr, "worker mode %s runs on Linux only\n", mode)
	return 1
}
