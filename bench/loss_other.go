//go:build !linux

package main

import (
	"context"
	"fmt"
	"io"
	"os"
)

// The prompt-loss cases read CLOCK_MONOTONIC in several processes, as the
// hand-over's do: Linux only, for now.

func runLoss(context.Context, *environment, []contender, options) (*lossReport, error) {
	return &lossReport{skipped: []string{"prompt loss skipped: it runs on Linux only"}}, nil
}

func lossWorkerMain(io.Reader, io.Writer) int {
	fmt.Fprintf(os.Stderr, "worker mode %s runs on Linux only\n", lossMode)
	return 1
}
