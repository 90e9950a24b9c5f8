package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// nobody is the user that a test runs as when it must not be root: root
// reads and writes any file whatever its mode, so a read-only database is
// read-only only for another user.
const nobody = 65534

// runsUnprivileged reports whether the calling test should run its body
// in this process. It does when the tests do not run as root. As root, it
// runs the same test again in a child process as nobody, fails t if the
// child does not pass it (a skip included), and reports false: the body
// has run, in the child.
func runsUnprivileged(t *testing.T) bool {
	t.Helper()
	if os.Geteuid() != 0 {
		return true
	}
	// The child needs a test binary and a temporary directory it can
	// reach: the build directory and t.TempDir's are private to root.
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "agents.test")
	copyExecutable(t, os.Args[0], bin)
	tmp := filepath.Join(dir, "tmp")
	require.NoError(t, os.Mkdir(tmp, 0o700))
	require.NoError(t, os.Chown(tmp, nobody, nobody))

	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(bin, "-test.run="+strings.Join(parts, "/"), "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Dir = tmp
	runAs(t, cmd, nobody)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s, run as uid %d:\n%s", t.Name(), nobody, out)
	require.Contains(t, string(out), "--- PASS: "+t.Name()+" ", "%s did not run as uid %d:\n%s", t.Name(), nobody, out)
	t.Logf("passed as uid %d:\n%s", nobody, out)
	return false
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
	require.NoError(t, os.Chmod(to, 0o755)) // whatever the umask
}
