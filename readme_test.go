package locks_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeStubs declares what the README's Go snippets leave to the reader:
// the work that the lock protects.
const readmeStubs = `package readme

import "context"

func mutatePlan(ctx context.Context, planID string, token int64) error { return nil }

func executePlan(ctx context.Context, token int64) error { return nil }
`

// goBlock is a fenced Go block of a Markdown file.
var goBlock = regexp.MustCompile("(?ms)^```go\n(.*?)^```\n")

// TestREADME_GoSnippetsCompile builds every Go block of the README as it
// is written, each as one file of a package (imports and declarations, as
// a reader pastes them into a file of theirs), in a module of its own
// that uses this one: a snippet that does not compile fails here, not in
// the hands of its reader.
func TestREADME_GoSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with the go command")
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	blocks := goBlock.FindAllSubmatch(readme, -1)
	require.NotEmpty(t, blocks, "the README has Go snippets")

	root, err := filepath.Abs(".")
	require.NoError(t, err)
	dir := t.TempDir()
	// The module requires what this one requires, at the same versions, so
	// that it builds from the module cache alone.
	mod, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	gomod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(string(mod), "module readme") +
		fmt.Sprintf("\nrequire github.com/cleveragents/locks v0.0.0\n\nreplace github.com/cleveragents/locks => %s\n", root)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o600))
	sum, err := os.ReadFile("go.sum")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "stubs.go"), []byte(readmeStubs), 0o600))
	for i, b := range blocks {
		src := "package readme\n\n" + string(b[1])
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("snippet%d.go", i+1)), []byte(src), 0o600))
	}

	cmd := exec.Command("go", "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the README's Go snippets (snippetN.go is the Nth ```go block) do not build:\n%s",
		strings.ReplaceAll(string(out), dir+string(filepath.Separator), ""))
}
