package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCLI_CobraWay: the checks of issue 21 on the binary: a mistyped
// command gets cobra's suggestion, a mistyped flag pflag's own words, and
// completion offers the resource types.
func TestCLI_CobraWay(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	r := a.run("lock")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "Did you mean this?\n\tlocks\n")

	r = a.run("locks", "acquire", "plan", "p", "--tll", "5m")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "unknown flag: --tll\n")
	assert.NoFileExists(t, a.db)

	r = a.run("__complete", "locks", "acquire", "")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, []string{"plan", "project", ":4"}, strings.Fields(r.stdout), "TYPE, and no file names (directive 4)")
	assert.NoFileExists(t, a.db)

	r = a.run("locks", "--help")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.True(t, strings.HasPrefix(r.stdout, "Usage: agents locks COMMAND"), r.stdout)
}

// TestCLI_MistypedCommandJSON: with --json, cobra's suggestion is one
// readable sentence in the error's message (it used to be cobra's lines
// run together: `...  Did you mean this?; locks `), with the usage error's
// exit code and JSON keys.
func TestCLI_MistypedCommandJSON(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	for args, want := range map[string]string{
		"lock":         `unknown command "lock" for "agents"; did you mean "locks"?`,
		"locks aquire": `unknown command "aquire" for "agents locks"; did you mean "acquire"?`,
		"locks ren":    `unknown command "ren" for "agents locks"; did you mean "run" or "renew"?`,
		"locks frob":   `unknown command "frob" for "agents locks"`,
	} {
		r := a.run(append([]string{"--json"}, strings.Fields(args)...)...)
		assert.Equal(t, 2, r.code, args)
		var doc map[string]map[string]any
		r.decode(t, &doc)
		assertKeys(t, doc["error"], "code", "message")
		assert.Equal(t, "validation", doc["error"]["code"], args)
		assert.Equal(t, want, doc["error"]["message"], args)
	}
}
