package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// failingWriter accepts its first ok writes, then fails every write, as
// stdout on a full disk does.
type failingWriter struct {
	ok     int
	failed bool
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.ok == 0 {
		w.failed = true
		return 0, syscall.ENOSPC
	}
	w.ok--
	return len(p), nil
}

// runTo runs a command with stdout going to w and stderr to a buffer.
func (h *harness) runTo(stdout, stderr io.Writer, args ...string) int {
	h.t.Helper()
	m := &Main{Stdout: stdout, Stderr: stderr, Env: func(k string) string { return h.env[k] }, Clock: h.clk, LocalTime: true, Location: zone}
	return m.Run(context.Background(), args)
}

const outputLost = "cannot write the output: no space left on device; anything the command changed stands, only its output is lost"

// TestMain_OutputWriteFails checks that every command, in both output
// modes, exits 1 with a message when any one of its writes to stdout
// fails: the first, or one in the middle of a table.
func TestMain_OutputWriteFails(t *testing.T) {
	commands := [][]string{
		{"locks", "acquire", "plan", "p1", "--owner", "alice"},
		{"locks", "acquire", "plan", "p2", "--owner", "alice"},
		{"locks", "renew", "plan", "p1", "--owner", "alice"},
		{"locks", "release", "plan", "p1", "--owner", "alice"},
		{"locks", "release", "plan", "p1", "--owner", "bob"},
		{"locks", "release-all", "--owner", "alice"},
		{"locks", "list"},
		{"locks", "list", "--all"},
		{"locks", "cleanup"},
		{"diagnostics"},
		{"-h"},
		{"locks", "acquire", "-h"},
	}
	// run runs args on a database in the same state every time (alice
	// holds plan/p1 since a minute), with stdout failing after ok writes.
	run := func(t *testing.T, ok int, args []string) (int, *failingWriter, string) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		h.clk.Add(time.Minute)
		w := &failingWriter{ok: ok}
		var stderr bytes.Buffer
		code := h.runTo(w, &stderr, args...)
		return code, w, stderr.String()
	}
	for _, args := range commands {
		for _, json := range []bool{false, true} {
			name := strings.Join(args, "_")
			if json {
				name, args = "JSON_"+name, append([]string{"--json"}, args...)
			}
			t.Run(name, func(t *testing.T) {
				const many = 1 << 20
				code, w, stderr := run(t, many, args)
				require.Equal(t, exitOK, code, "stderr: %s", stderr)
				writes := many - w.ok
				require.NotZero(t, writes, "every command writes something")
				for ok := range writes {
					code, w, stderr := run(t, ok, args)
					require.True(t, w.failed)
					assert.Equal(t, exitFailure, code, "write %d of %d failed: a lost output is a failure", ok+1, writes)
					assert.Contains(t, stderr, outputLost, "write %d of %d failed", ok+1, writes)
				}
			})
		}
	}
}

func TestMain_OutputWriteFailsKeepsExitCodes(t *testing.T) {
	t.Run("AcquiredLockStands", func(t *testing.T) {
		h := newHarness(t)
		var stderr bytes.Buffer
		require.Equal(t, exitFailure, h.runTo(&failingWriter{}, &stderr, "locks", "acquire", "plan", "p1", "--owner", "alice"))
		var ls []listedLock
		h.mustRun("--json", "locks", "list").decode(t, &ls)
		require.Len(t, ls, 1, "the message says what the command changed stands")
		assert.Equal(t, "alice", ls[0].OwnerID)
	})
	t.Run("ConflictStaysExit3", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		for _, args := range [][]string{{"locks", "acquire", "plan", "p1", "--owner", "bob"}, {"--json", "locks", "acquire", "plan", "p1", "--owner", "bob"}} {
			var stderr bytes.Buffer
			assert.Equal(t, exitConflict, h.runTo(&failingWriter{}, &stderr, args...), "%v", args)
			assert.Contains(t, stderr.String(), `is held by another owner: "alice"`)
		}
	})
	t.Run("UsageStaysExit2", func(t *testing.T) {
		h := newHarness(t)
		var stderr bytes.Buffer
		assert.Equal(t, exitUsage, h.runTo(&failingWriter{}, &stderr, "--json", "locks", "frob"))
		assert.Contains(t, stderr.String(), `unknown command "frob" for "agents locks"`)
	})
	t.Run("StderrFailsToo", func(t *testing.T) {
		h := newHarness(t)
		assert.Equal(t, exitFailure, h.runTo(&failingWriter{}, &failingWriter{}, "locks", "list"))
	})
}
