package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain_Flags covers what the flag parser gives every command: flags
// anywhere among the arguments, each command's own flags only, and the
// help spelling them as the docs do.
func TestMain_Flags(t *testing.T) {
	t.Run("BetweenAndAfterArguments", func(t *testing.T) {
		h := newHarness(t)
		var l lockDoc
		h.mustRun("locks", "acquire", "plan", "--ttl", "90s", "p1", "--owner", "alice", "--json").decode(t, &l)
		assert.Equal(t, "alice", l.OwnerID)
		assert.Equal(t, "2026-11-29T19:01:30.000000Z", l.ExpiresAt)
	})
	t.Run("SwitchesBeforeTheCommand", func(t *testing.T) {
		// A flag that takes no value, before the command, must not take
		// the argument after it for its value: cobra, looking for the
		// command, knows only the flags of agents itself.
		h := newHarness(t)
		delete(h.env, "AGENTS_CREATE")
		db := filepath.Join(t.TempDir(), "other.db")
		h.mustRun("--create", "--db", db, "--owner", "alice", "locks", "acquire", "plan", "p1")
		h.mustRun("--wait", "--timeout", "1s", "--db", db, "--owner", "alice", "locks", "acquire", "plan", "p1")
		r := h.mustRun("--json", "--all", "--db", db, "locks", "list")
		assert.Contains(t, r.stdout, `"owner_id": "alice"`)
	})
	t.Run("SingleDashStillWorks", func(t *testing.T) {
		h := newHarness(t)
		r := h.mustRun("-owner", "alice", "locks", "acquire", "plan", "p1", "-ttl", "60", "-json")
		assert.Contains(t, r.stdout, `"owner_id": "alice"`)
	})
	t.Run("OwnerOnlyWhereItActs", func(t *testing.T) {
		h := newHarness(t)
		h.createStore()
		for _, args := range [][]string{
			{"locks", "cleanup", "--owner", "alice"},
			{"--owner", "alice", "diagnostics"},
		} {
			r := h.run(args...)
			assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
			assert.Contains(t, r.stderr, "unknown flag: --owner", "%v", args)
		}
		r := h.mustRun("locks", "cleanup", "-h")
		assert.NotContains(t, r.stdout, "--owner")
		assert.NotContains(t, r.stdout, "--ttl")
	})
	t.Run("HelpSpellsDoubleDash", func(t *testing.T) {
		r := newHarness(t).mustRun("locks", "acquire", "-h")
		for _, flag := range []string{"--db PATH", "--json", "--owner ID", "--ttl D", "--wait", "--timeout D"} {
			assert.Contains(t, r.stdout, flag)
		}
		assert.NotRegexp(t, `(?m)^\s+-(db|owner|ttl|json)\b`, r.stdout, "no single-dash spelling")
	})
	t.Run("TTLOnlyWhereItActs", func(t *testing.T) {
		h := newHarness(t)
		h.createStore()
		r := h.run("--owner", "alice", "locks", "release", "plan", "p1", "--ttl", "60")
		assert.Equal(t, exitUsage, r.code)
		assert.Contains(t, r.stderr, "unknown flag: --ttl")
	})
}

func TestMain_Version(t *testing.T) {
	r := newHarness(t).mustRun("--version")
	require.Regexp(t, `^agents \S+(, revision [0-9a-f]+( \(modified\))?)?, go\S+\n$`, r.stdout)
	assert.Empty(t, r.stderr)
}

func TestMain_Completion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		t.Run(shell, func(t *testing.T) {
			r := newHarness(t).mustRun("completion", shell)
			assert.Contains(t, r.stdout, "agents")
			assert.Contains(t, r.stdout, shell)
			help := newHarness(t).mustRun("completion", shell, "-h")
			assert.Contains(t, help.stdout, "autocompletion script for the "+shell+" shell", "cobra's own help for its command")
		})
	}
}
