package main

import (
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// readDoc returns a documentation file of the module.
func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile("../../" + path)
	require.NoError(t, err)
	return string(b)
}

// docChecks returns the checks that the table of docs/cli.md's
// Diagnostics section names, and those it marks as PostgreSQL's only.
func docChecks(t *testing.T) (all, postgresOnly []string) {
	t.Helper()
	doc := readDoc(t, "docs/cli.md")
	_, section, ok := strings.Cut(doc, "\n## Diagnostics\n")
	require.True(t, ok, "docs/cli.md has a Diagnostics section")
	section, _, _ = strings.Cut(section, "\n## ")
	for _, m := range regexp.MustCompile("(?m)^\\| `(\\w+)`( \\(PostgreSQL only\\))? \\|").FindAllStringSubmatch(section, -1) {
		all = append(all, m[1])
		if m[2] != "" {
			postgresOnly = append(postgresOnly, m[1])
		}
	}
	return all, postgresOnly
}

// checkNames runs diagnostics and returns the names of its checks.
func (h *harness) checkNames() []string {
	h.t.Helper()
	var rep report
	h.mustRun("--json", "diagnostics").decode(h.t, &rep)
	names := make([]string, 0, len(rep.Checks))
	for _, c := range rep.Checks {
		names = append(names, c.Name)
	}
	return names
}

// TestDocs_DiagnosticsChecks: docs/cli.md and the README name the checks
// that diagnostics runs, all of them, in its order, and count them right.
func TestDocs_DiagnosticsChecks(t *testing.T) {
	all, postgresOnly := docChecks(t)
	h := newHarness(t)
	h.createStore()
	got := h.checkNames()
	onFile := make([]string, 0, len(all))
	for _, name := range all {
		if !slices.Contains(postgresOnly, name) {
			onFile = append(onFile, name)
		}
	}
	assert.Equal(t, onFile, got, "the checks on a file, as docs/cli.md's table lists them")

	doc := readDoc(t, "docs/cli.md")
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven"}
	for _, m := range regexp.MustCompile(`names all (\w+)|runs the same (\w+) checks`).FindAllStringSubmatch(doc, -1) {
		assert.Equal(t, words[len(got)], m[1]+m[2], "docs/cli.md: %q", m[0])
	}

	readme := readDoc(t, "README.md")
	_, sample, ok := strings.Cut(readme, "$ agents diagnostics\n")
	require.True(t, ok, "the README shows diagnostics")
	sample, _, _ = strings.Cut(sample, "$ ")
	var shown []string
	for _, m := range regexp.MustCompile(`(?m)^  (?:ok|warn|fail)\s+(\w+)`).FindAllStringSubmatch(sample, -1) {
		shown = append(shown, m[1])
	}
	assert.Equal(t, got, shown, "the README's diagnostics sample")

	t.Run("PostgreSQL", func(t *testing.T) {
		h := newHarness(t)
		h.env["AGENTS_DB"] = testdb.Postgres(t)
		h.createStore()
		assert.Equal(t, all, h.checkNames(), "the checks on PostgreSQL, as docs/cli.md's table lists them")
	})
}

// TestDocs_DefaultOwner: the default owner id that docs/cli.md shows has
// the shape of the one that this system gives (locks.DefaultOwner, with
// the process group of locks run on Linux).
func TestDocs_DefaultOwner(t *testing.T) {
	doc := readDoc(t, "docs/cli.md")
	m := regexp.MustCompile("`locks run` does without: its owner is then an id of the agents process: on Linux `([^`]+)` .*?elsewhere .*?`([^`]+)`").
		FindStringSubmatch(doc)
	require.NotNil(t, m, "docs/cli.md gives the default owner of locks run")
	linux, other := m[1], m[2]
	p, ok := domain.ParseProcessOwner(linux)
	require.True(t, ok, "the Linux example is a process owner id: %s", linux)
	assert.Positive(t, p.Group, "the Linux example names CMD's process group")
	assert.Regexp(t, `^[^:/]+:[0-9]+:[0-9a-f]{8}$`, other)

	real := locks.DefaultOwner()
	if _, ok := domain.ParseProcessOwner(real); runtime.GOOS == "linux" && ok {
		return
	}
	assert.Regexp(t, `^[^:/]+:[0-9]+:[0-9a-f]{8}$`, real, "the default owner on %s", runtime.GOOS)
}
