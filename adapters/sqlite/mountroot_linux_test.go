//go:build linux

package sqlite_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

// A database file bind-mounted onto another name (a mount of a single
// file) has side files by each name: SQLite's journal, the wake file and
// the owner claims would be two, and the owner id that a store of one
// name claims could be claimed again through the other. Open refuses the
// mounted name, before it creates anything beside it; the file's own name
// opens as before. Root makes the mount, in a mount namespace of the
// worker's own.
func TestOpen_RefusesABindMountedFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can bind-mount a file")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1) to make a private mount namespace")
	}
	ctx := context.Background()
	dir := t.TempDir()
	orig, other := filepath.Join(dir, "agents.db"), filepath.Join(t.TempDir(), "mounted.db")
	db, err := sqlite.Open(ctx, orig, sqlite.Options{Owner: "shared"})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, os.WriteFile(other, nil, 0o600)) // the mount point

	cmd := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" "$2" && exec "$3" -test.run='^$'`, "sh", orig, other, os.Args[0])
	cmd.Env = append(os.Environ(), workerEnv+"=open-owner", dbEnv+"="+other, ownerEnv+"=shared")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	var r workerReport
	require.NoError(t, json.Unmarshal(out, &r), "%s", out)
	require.NotEmpty(t, r.Error, "the mounted name was opened, with the owner id the file's own name claims")
	assert.Equal(t, "MountedFileError", r.As, r.Error)
	assert.Equal(t, domain.StoreUnreachable.String(), r.Kind, r.Error)
	for _, side := range []string{"-wal", "-shm", "-wake", "-lock"} {
		assert.NoFileExists(t, other+side, "created beside the refused name")
	}
}

// A side file (SQLite's journal, -wal and -shm, the writers' queue, the
// wake file and owner claims) bind-mounted onto another file, in a mount
// namespace, would give the processes there a journal, a queue or claims
// of their own: two processes could both hold one lock with one token.
// Open refuses the database there with a *sqlite.MountedFileError naming
// the side file, before it writes or creates anything: the database and
// its directory are left as they were.
func TestOpen_RefusesABindMountedSideFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can bind-mount a file")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1) to make a private mount namespace")
	}
	for _, side := range []string{"-journal", "-wal", "-shm", "-lock", "-wake"} {
		t.Run(side, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "agents.db")
			db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			require.NoError(t, db.Close())
			// The mount point, if the store left none, and the file mounted
			// there: empty regular files of the store's owner, one name each.
			if _, err := os.Lstat(path + side); err != nil {
				require.NoError(t, os.WriteFile(path+side, nil, 0o600))
			}
			other := filepath.Join(t.TempDir(), "other"+side)
			require.NoError(t, os.WriteFile(other, nil, 0o600))
			before, listed := fileBytes(t, path), dirNames(t, dir)

			cmd := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c",
				`mount --bind "$1" "$2" && exec "$3" -test.run='^$'`, "sh", other, path+side, os.Args[0])
			cmd.Env = append(os.Environ(), workerEnv+"=open-owner", dbEnv+"="+path, ownerEnv+"=shared")
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			require.NoError(t, err)
			var r workerReport
			require.NoError(t, json.Unmarshal(out, &r), "%s", out)
			require.NotEmpty(t, r.Error, "opened with %s bind-mounted onto another file", side)
			assert.Equal(t, "MountedFileError", r.As, r.Error)
			assert.Equal(t, domain.StoreUnreachable.String(), r.Kind, r.Error)
			assert.Contains(t, r.Error, path+side, "the error names the mounted side file")
			assert.Equal(t, before, fileBytes(t, path), "the refused database was changed")
			assert.Equal(t, listed, dirNames(t, dir), "a side file was created or removed beside the refused database")
		})
	}
}

func fileBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}

// A side file bind-mounted after the store opened is refused to the next
// connection: the pool checks SQLite's side files before each one.
func TestSideFile_BindMountedAfterOpen(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can bind-mount a file")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1) to make a private mount namespace")
	}
	path := filepath.Join(t.TempDir(), "agents.db")
	other := filepath.Join(t.TempDir(), "other-wal")
	require.NoError(t, os.WriteFile(other, nil, 0o600))

	cmd := exec.Command(unshare, "--mount", "--propagation", "private", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"=mount-after-open", dbEnv+"="+path, mountEnv+"="+other+" "+path+"-wal")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	var r workerReport
	require.NoError(t, json.Unmarshal(out, &r), "%s", out)
	require.NotEmpty(t, r.Error, "a new connection read with -wal bind-mounted onto another file")
	assert.Equal(t, "MountedFileError", r.As, r.Error)
	assert.Contains(t, r.Error, path+"-wal", "the error names the mounted side file")
}
