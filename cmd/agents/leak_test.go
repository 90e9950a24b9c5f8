package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's run if any goroutine it started (a
// keep-alive, a cleanup loop, a wait, a clock refresh) outlives its tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
