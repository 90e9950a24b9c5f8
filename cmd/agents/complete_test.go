package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain_CobraWay: the command line is cobra's and pflag's, in their
// words: suggestions for a mistyped command, flag errors in the --flag
// form, the help of the locks group, and --version --json.
func TestMain_CobraWay(t *testing.T) {
	t.Run("SuggestsCommand", func(t *testing.T) {
		for args, want := range map[string]string{
			"lock":           "unknown command \"lock\" for \"agents\"\n\nDid you mean this?\n\tlocks\n",
			"locks aquire":   "unknown command \"aquire\" for \"agents locks\"\n\nDid you mean this?\n\tacquire\n",
			"diagnostic":     "Did you mean this?\n\tdiagnostics\n",
			"locks relase":   "Did you mean this?\n\trelease\n",
			"locks cleanupp": "Did you mean this?\n\tcleanup\n",
		} {
			h := newHarness(t)
			r := h.run(strings.Fields(args)...)
			assert.Equal(t, exitUsage, r.code, args)
			assert.Contains(t, r.stderr, want, args)
			assert.Empty(t, r.stdout, args)
			assert.NoFileExists(t, h.db)
			var doc struct{ Error errorDoc }
			h.run(append([]string{"--json"}, strings.Fields(args)...)...).decode(t, &doc)
			assert.Equal(t, "validation", doc.Error.Code, args)
		}
	})
	t.Run("FlagErrorsAsPflagWritesThem", func(t *testing.T) {
		for _, tc := range []struct{ args, want string }{
			{"locks acquire plan p --tll 5m --owner a", "unknown flag: --tll\n"},
			{"locks acquire plan p -tll 5m --owner a", "unknown flag: --tll\n"},
			{"locks acquire plan p --owner a --ttl", "flag needs an argument: --ttl\n"},
			{"locks acquire plan p --owner a --ttl 4s", `invalid argument "4s" for "--ttl" flag: the TTL must be from 5s to 1h`},
			{"locks acquire plan p --owner a -x", "unknown shorthand flag: 'x' in -x\n"},
		} {
			r := newHarness(t).run(strings.Fields(tc.args)...)
			assert.Equal(t, exitUsage, r.code, tc.args)
			assert.Contains(t, r.stderr, "agents locks acquire: "+tc.want, tc.args)
		}
	})
	t.Run("LocksHelpIsTheGroups", func(t *testing.T) {
		for _, args := range [][]string{{"locks", "--help"}, {"locks", "-h"}, {"help", "locks"}} {
			r := newHarness(t).mustRun(args...)
			assert.True(t, strings.HasPrefix(r.stdout, "Usage: agents locks COMMAND"), "%v: %s", args, r.stdout)
			assert.Contains(t, r.stdout, "\n  acquire TYPE ID")
			assert.Contains(t, r.stdout, "\n  cleanup\n")
			assert.NotContains(t, r.stdout, "diagnostics", "%v: not the root's help", args)
		}
	})
	t.Run("VersionJSON", func(t *testing.T) {
		r := newHarness(t).mustRun("--version", "--json")
		var doc map[string]any
		r.decode(t, &doc)
		assert.ElementsMatch(t, []string{"version", "revision", "modified", "go"}, keys(doc))
		assert.Regexp(t, `^go\S+$`, doc["go"])
		assert.Empty(t, r.stderr)
		r = newHarness(t).mustRun("--json", "-v")
		r.decode(t, &doc)
		r = newHarness(t).mustRun("-v")
		assert.Regexp(t, `^agents \S+(, revision [0-9a-f]+( \(modified\))?)?, go\S+\n$`, r.stdout, "-v, as cobra's own flag had it")
	})
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// complete runs cobra's completion request and returns what it offers,
// without the directive line.
func (h *harness) complete(args ...string) []string {
	h.t.Helper()
	r := h.mustRun(append([]string{"__complete"}, args...)...)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.NotEmpty(h.t, lines)
	require.True(h.t, strings.HasPrefix(lines[len(lines)-1], ":"), "the directive: %q", r.stdout)
	return lines[:len(lines)-1]
}

// TestMain_Completion_TypeAndID: completion offers TYPE, then the ids of
// the resources of that type that the database holds locks on, read
// without creating a database; and flag descriptions without backquotes.
func TestMain_Completion_TypeAndID(t *testing.T) {
	h := newHarness(t)
	for _, cmd := range []string{"acquire", "run", "renew", "release"} {
		assert.Equal(t, []string{"plan", "project"}, h.complete("locks", cmd, ""), cmd)
		assert.Equal(t, []string{"project"}, h.complete("locks", cmd, "pro"), cmd)
	}
	assert.Empty(t, h.complete("locks", "acquire", "plan", ""), "no database, no ids")
	assert.NoFileExists(t, h.db, "completion creates no database")

	h.mustRun("locks", "acquire", "plan", "p1", "--owner", "a")
	h.mustRun("locks", "acquire", "plan", "p2", "--owner", "b")
	h.mustRun("locks", "acquire", "project", "x", "--owner", "a")
	assert.Equal(t, []string{"p1", "p2"}, h.complete("locks", "release", "plan", ""))
	assert.Equal(t, []string{"x"}, h.complete("locks", "renew", "--owner", "a", "project", ""))
	assert.Equal(t, []string{"p2"}, h.complete("locks", "acquire", "plan", "p2"))
	missing := filepath.Join(t.TempDir(), "missing.db")
	assert.Empty(t, h.complete("--db", missing, "locks", "acquire", "plan", ""))
	assert.NoFileExists(t, missing, "completion creates no database")
	assert.Equal(t, []string{"plan", "project"}, h.complete("locks", "list", "--type", ""))

	for _, cmd := range []string{"acquire", "run", "list"} {
		offered := h.complete("locks", cmd, "--")
		require.NotEmpty(t, offered)
		for _, line := range offered {
			assert.NotContains(t, line, "`", "a flag description with raw backquotes: %q", line)
		}
		assert.Contains(t, offered, "--db\tthe lock database: a file PATH, a file: URI or a postgres:// URL (env AGENTS_DB; default $XDG_DATA_HOME/cleveragents/agents.db)")
	}
	t.Run("HelpKeepsValueNames", func(t *testing.T) {
		r := h.mustRun("locks", "acquire", "-h")
		assert.Contains(t, r.stdout, "--owner ID")
	})
}

// TestMain_Completion_SilentServer: a PostgreSQL server that accepts the
// connection and never answers holds completion up for completionDeadline
// at most, and offers no ids.
func TestMain_Completion_SilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn // open, never answered
		for {
			conn, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					_ = c.Close()
				}
				return
			}
			held = append(held, conn)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	h := newHarness(t)
	h.env["AGENTS_DB"] = "postgres://agents@" + ln.Addr().String() + "/locks"
	began := time.Now()
	assert.Empty(t, h.complete("locks", "release", "plan", ""))
	assert.Less(t, time.Since(began), completionDeadline+5*time.Second, "completion waited past its deadline")
}
