package cli

import (
	"os/exec"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLI_Version: "agents --version" prints the module version and, when
// the build recorded one, the VCS revision, as "go version -m" reads them
// from the binary.
func TestCLI_Version(t *testing.T) {
	t.Parallel()
	r := newAgents(t).runEnv(nil, "--version")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^agents \S+(, revision [0-9a-f]+( \(modified\))?)?, go\S+\n$`, r.stdout)
	out, err := exec.Command("go", "version", "-m", agentsBin).Output()
	require.NoError(t, err)
	if m := regexp.MustCompile(`(?m)^\s+build\s+vcs\.revision=(\S+)$`).FindSubmatch(out); m != nil {
		assert.Contains(t, r.stdout, "revision "+string(m[1]))
	}
	if m := regexp.MustCompile(`(?m)^\s+mod\s+\S+\s+(\S+)`).FindSubmatch(out); m != nil {
		assert.Contains(t, r.stdout, "agents "+string(m[1]))
	}
}

// TestCLI_Completion: "agents completion SHELL" prints a script that the
// shell can load.
func TestCLI_Completion(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	for shell, marker := range map[string]string{"bash": "complete -o default", "zsh": "#compdef agents", "fish": "complete -c agents"} {
		r := a.runEnv(nil, "completion", shell)
		require.Equal(t, 0, r.code, "%s: %s", shell, r.stderr)
		assert.Contains(t, r.stdout, marker, shell)
	}
	out, err := exec.Command("bash", "-c", `source <("$0" completion bash) && complete -p agents`, agentsBin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "agents")
}
