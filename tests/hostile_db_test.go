package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// A database that fights back: each case must give a typed error that
// names the cause and what to do, never a panic, and never a lock reported
// as held that is not in the table.

// fightResult is what workerFight reports.
type fightResult struct {
	Stage string `json:"stage"` // "open" or "acquire"; "" when both worked
	Kind  string `json:"kind"`
	Error string `json:"error"`
}

// workerFight opens the database and acquires one lock, as whatever user
// it was started as, and reports how that went.
func workerFight() int {
	ctx := context.Background()
	res := fightResult{}
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: "fighter"})
	if err == nil {
		_, err = c.Locks.Acquire(ctx, "fighter", stressResources[0], 0)
		res.Stage = "acquire"
		c.Close()
	} else {
		res.Stage = "open"
	}
	if err == nil {
		res.Stage = ""
	} else {
		res.Error = err.Error()
		var se *domain.StoreError
		if errors.As(err, &se) {
			res.Kind = se.Kind.String()
		}
	}
	return reportJSON(res)
}

// runFight runs workerFight on db as an unprivileged user when the tests
// run as root (root ignores file permissions, so the case would not be
// real otherwise).
func runFight(t *testing.T, db string) fightResult {
	t.Helper()
	bin := os.Args[0]
	cmd := startWorker(t, "fight", envDB+"="+db)
	if os.Geteuid() == 0 {
		// The test binary must be reachable by the unprivileged user.
		dir := reachableTempDir(t)
		copyFile(t, bin, filepath.Join(dir, "tests.test"), 0o755)
		cmd.Path, cmd.Args[0] = filepath.Join(dir, "tests.test"), filepath.Join(dir, "tests.test")
		runAs(t, cmd, 65534)
		cmd.Dir = dir
	}
	out, err := cmd.Output()
	require.NoError(t, err)
	var res fightResult
	require.NoError(t, json.Unmarshal(out, &res), "%s", out)
	return res
}

// reachableTempDir returns a temporary directory that other users can
// enter (t.TempDir and its parent are private).
func reachableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

// sharedDir returns a temporary directory that an unprivileged user can
// reach, with a database created in it.
func sharedDir(t *testing.T) (dir, db string) {
	t.Helper()
	dir = filepath.Join(reachableTempDir(t), "shared")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chmod(dir, 0o777))
	db = filepath.Join(dir, "agents.db")
	c, err := locks.Open(context.Background(), locks.Config{Database: db})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	return dir, db
}

func TestHostileDB_ReadOnlyFile(t *testing.T) {
	_, db := sharedDir(t)
	require.NoError(t, os.Chmod(db, 0o444))
	res := runFight(t, db)
	assert.Equal(t, "read-only", res.Kind, "%+v", res)
	assert.Contains(t, res.Error, "writable")
	for _, leftover := range []string{db + "-wal", db + "-shm"} {
		assert.NoFileExists(t, leftover, "refusing a read-only store leaves nothing behind")
	}
}

func TestHostileDB_ReadOnlyDirectory(t *testing.T) {
	dir, db := sharedDir(t)
	require.NoError(t, os.Chmod(db, 0o666))
	require.NoError(t, os.Chmod(dir, 0o555)) // no room for the -wal and -shm files
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	res := runFight(t, db)
	t.Logf("%+v", res)
	assert.Contains(t, []string{"read-only", "unreachable"}, res.Kind, "%+v", res)
	assert.NotEmpty(t, res.Stage)
}

func TestHostileDB_NotADatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agents.db")
	junk := []byte(strings.Repeat("not a database; ", 512))
	require.NoError(t, os.WriteFile(path, junk, 0o600))
	_, err := locks.Open(context.Background(), locks.Config{Database: path})
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.True(t, domain.IsStoreKind(err, domain.StoreCorrupt), "%v", err)
	assert.Contains(t, err.Error(), "not a valid database")
	after, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	assert.Equal(t, junk, after)
}

func TestHostileDB_LockedByAnotherProcess(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	c := MustOpen(t, locks.Config{Database: db, Owner: "A", BusyTimeout: 100 * time.Millisecond})

	holder := startWorker(t, "hold", envDB+"="+db)
	out, err := holder.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, holder.Start())
	require.Equal(t, "holding", waitLine(t, bufio.NewScanner(out)))

	_, err = c.Locks.Acquire(ctx, "A", stressResources[0], 0)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.True(t, domain.IsStoreKind(err, domain.StoreBusy), "%v", err)
	assert.True(t, strings.HasPrefix(err.Error(), "acquire lock on plan/alpha: lock store is busy"),
		"the explanation comes first, the driver's text only as the cause: %v", err)
	assert.Contains(t, err.Error(), "retry later")

	_, err = c.Locks.Get(ctx, stressResources[0])
	require.ErrorIs(t, err, domain.ErrNotFound, "a failed acquire is not reported as held")

	require.NoError(t, holder.Process.Kill())
	_ = holder.Wait()
	_, err = c.Locks.Acquire(ctx, "A", stressResources[0], 0)
	require.NoError(t, err, "works again once the other process is gone")
}

func TestHostileDB_Full(t *testing.T) {
	// The driver cannot fill a disk, but SQLite's max_page_count makes the
	// database itself full, which takes the same path (SQLITE_FULL).
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	c := MustOpen(t, locks.Config{Database: "file:" + path + "?_pragma=max_page_count(12)", Owner: "A"})
	var (
		held []domain.ResourceRef
		err  error
	)
	for i := 0; i < 10_000; i++ {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 200))}
		if _, err = c.Locks.Acquire(ctx, "A", ref, 0); err != nil {
			_, gerr := c.Locks.Get(ctx, ref)
			require.ErrorIs(t, gerr, domain.ErrNotFound, "the lock that did not fit is not reported as held")
			break
		}
		held = append(held, ref)
	}
	require.ErrorIs(t, err, domain.ErrUnavailable)
	assert.True(t, domain.IsStoreKind(err, domain.StoreFull), "%v", err)
	assert.Contains(t, err.Error(), "free disk space")
	require.NotEmpty(t, held)
	for _, ref := range held {
		got, err := c.Locks.Get(ctx, ref)
		require.NoError(t, err)
		require.Equal(t, "A", got.Owner)
	}
	ok, err := c.Locks.Release(ctx, "A", held[0])
	require.NoError(t, err)
	assert.True(t, ok, "releasing still works when full")
}
