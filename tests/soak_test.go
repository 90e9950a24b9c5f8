package tests

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// soakFor is how long TestSoak_SharedFile runs: LOCKS_SOAK (e.g. 60s), or
// 4 s by default.
func soakFor(t *testing.T) time.Duration {
	if s := os.Getenv("LOCKS_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "LOCKS_SOAK")
		return d
	}
	return 4 * time.Second
}

// The file is shared as the spec means it to be: the application writes
// its own table in it (through Container.Write) and keeps a 5 s lock alive,
// the stock sqlite3 shell reads the table every second, and 4 processes
// acquire and release locks on it (the "loop" workers of
// TestProcesses_MutualExclusion, with their witness of the critical
// section). Nothing may overlap, no committed row of the application may
// be lost, the shell never fails nor deletes the -wal or -shm under the
// application, and the file passes integrity_check. docs/reliability.md
// records a 60 s run (LOCKS_SOAK=60s).
func TestSoak_SharedFile(t *testing.T) {
	shell, err := exec.LookPath("sqlite3")
	if err != nil {
		t.Skip("needs the sqlite3 shell (Debian's package sqlite3)")
	}
	const procs = 4
	dur := soakFor(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	dir := t.TempDir() // the witnesses
	c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "app"})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "CREATE TABLE app (n INTEGER PRIMARY KEY)")
		return err
	}))
	h, err := c.Locks.Take(ctx, "app", domain.ResourceRef{Type: domain.ResourcePlan, ID: "app"},
		application.AcquireOptions{TTL: domain.MinLockTTL})
	require.NoError(t, err)
	held := h.KeepAlive(ctx)

	var (
		wg        sync.WaitGroup
		stats     = make([]workerStats, procs)
		stop      = make(chan struct{})
		committed atomic.Int64
	)
	for i := range procs {
		cmd := startWorker(t, "loop", envDB+"="+path, envDir+"="+dir,
			envOwner+"=proc-"+strconv.Itoa(i), envDuration+"="+dur.String())
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, json.NewDecoder(out).Decode(&stats[i]), "worker %d report", i)
			assert.NoError(t, cmd.Wait(), "worker %d", i)
		}()
	}
	var side sync.WaitGroup
	side.Add(2)
	go func() { // the application's writes, back to back
		defer side.Done()
		for n := int64(0); ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			err := c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO app (n) VALUES (?)", n)
				return err
			})
			if !assert.NoError(t, err, "application write %d", n) {
				return
			}
			committed.Store(n + 1)
		}
	}()
	shellReads := 0
	go func() { // the shell, every second
		defer side.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		last := -1
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			floor := committed.Load()
			// A WAL reader can find the index being rebuilt, rarely, and
			// wait: the timeout lets it, as any tool of the operator's would.
			out, err := exec.Command(shell, "-cmd", ".timeout 5000", path, "SELECT count(*) FROM app").CombinedOutput()
			if !assert.NoError(t, err, "the sqlite3 shell: %s", out) {
				return
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(out)))
			require.NoError(t, err, "%s", out)
			assert.GreaterOrEqual(t, int64(n), floor, "the shell misses committed rows")
			assert.GreaterOrEqual(t, n, last, "the shell's count went back")
			last = n
			shellReads++
			for _, suffix := range []string{"-wal", "-shm"} {
				_, err := os.Stat(path + suffix)
				assert.NoError(t, err, "the shell deleted %s under the application", suffix)
			}
		}
	}()
	wg.Wait()
	close(stop)
	side.Wait()

	select {
	case <-held.Done():
		t.Errorf("the application's kept-alive lock was lost: %v", context.Cause(held))
	default:
	}
	_, err = h.Release(ctx)
	require.NoError(t, err)

	var entries, overlaps int
	for _, st := range stats {
		entries += st.Entries
		overlaps += st.Overlaps
		assert.Empty(t, st.Errors, "%s saw errors other than conflicts", st.Owner)
		assert.Positive(t, st.Entries, "%s never got in", st.Owner)
	}
	assert.Zero(t, overlaps, "two owners were inside one critical section")
	for _, ref := range stressResources {
		tokens, _ := readWitnessLog(t, filepath.Join(dir, string(ref.Type)+"-"+ref.ID+".log"))
		for i := 1; i < len(tokens); i++ {
			require.Greater(t, tokens[i], tokens[i-1], "%s: tokens must increase in the order of entry", ref)
		}
	}
	assert.Equal(t, entries, countLines(t, dir), "every entry is in a witness log")

	// Every committed row, and nothing else, seen by a connection of the
	// application and by the shell.
	dsn, err := sqlite.DSN(path, 0)
	require.NoError(t, err)
	app, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	defer app.Close()
	want := committed.Load()
	var rows, sum int64
	require.NoError(t, app.QueryRow("SELECT count(*), coalesce(sum(n), 0) FROM app").Scan(&rows, &sum))
	assert.Equal(t, want, rows, "application rows lost (or extra)")
	assert.Equal(t, want*(want-1)/2, sum, "the rows are not 0..%d", want-1)
	var integrity string
	require.NoError(t, app.QueryRow("PRAGMA integrity_check").Scan(&integrity))
	assert.Equal(t, "ok", integrity)
	out, err := exec.Command(shell, path, "SELECT count(*) FROM app; PRAGMA integrity_check;").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, strconv.FormatInt(want, 10)+"\nok\n", string(out), "what the shell sees at the end")
	t.Logf("%v, %d processes: %d entries, %d overlaps; %d application rows committed, %d lost; "+
		"%d shell reads; integrity_check %s", dur, procs, entries, overlaps, want, want-rows, shellReads, integrity)
}
