package tests

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// workerChurn takes locks and reports them (mode "hold-locks"), or churns
// through every write the service has until it is killed.
func workerChurn() int {
	ctx := context.Background()
	owner := os.Getenv(envOwner)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: owner, KeepLocksOnClose: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	if os.Getenv(envDuration) == "hold-locks" {
		var held []domain.Lock
		for _, ref := range stressResources {
			l, err := c.Locks.Acquire(ctx, owner, ref, 30*time.Second)
			if err != nil {
				fmt.Fprintln(os.Stderr, "acquire:", err)
				return 1
			}
			held = append(held, l)
		}
		reportJSON(held)
		select {} // wait to be killed
	}
	fmt.Println("churning")
	for i := 0; ; i++ {
		ref := stressResources[rand.IntN(len(stressResources))]
		switch i % 5 {
		case 0, 1:
			c.Locks.Acquire(ctx, owner, ref, time.Duration(5+rand.IntN(55))*time.Second)
		case 2:
			c.Locks.Renew(ctx, owner, ref, 0)
		case 3:
			c.Locks.Release(ctx, owner, ref)
		case 4:
			if i%20 == 4 {
				c.Locks.ReleaseAllForOwner(ctx, owner)
			} else {
				c.Locks.CleanupExpired(ctx)
			}
		}
	}
}

// workerHold holds SQLite's write lock in a transaction until killed.
func workerHold() int {
	db, err := sql.Open("sqlite", "file:"+os.Getenv(envDB))
	if err != nil {
		return 1
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		return 1
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		fmt.Fprintln(os.Stderr, "begin:", err)
		return 1
	}
	fmt.Println("holding")
	select {}
}

// waitLine waits for the worker to print its first line.
func waitLine(t *testing.T, sc *bufio.Scanner) string {
	t.Helper()
	require.True(t, sc.Scan(), "the worker exited early")
	return sc.Text()
}

func TestCrash_LocksOfKilledProcess(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	cmd := startWorker(t, "churn", envDB+"="+db, envOwner+"=doomed", envDuration+"=hold-locks")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var held []domain.Lock
	require.NoError(t, json.NewDecoder(out).Decode(&held))
	require.NoError(t, cmd.Process.Kill()) // SIGKILL: no graceful shutdown
	_ = cmd.Wait()

	// The dead process's clock was the real one; ours is a mock, set to
	// the instants that matter for its locks.
	mc := clock.NewMock()
	mc.Set(held[0].AcquiredAt.Add(time.Second))
	survivor, err := locks.Open(ctx, locks.Config{Database: db, Owner: "survivor", Clock: mc})
	require.NoError(t, err)
	defer survivor.Close()
	for _, l := range held {
		_, err := survivor.Locks.Acquire(ctx, "survivor", l.Resource, 0)
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce, "refused while the dead owner's TTL runs")
		assert.Equal(t, "doomed", ce.Holder.Owner)
	}

	mc.Set(held[len(held)-1].ExpiresAt)
	restarted, err := locks.Open(ctx, locks.Config{Database: db, Owner: "restarted", Clock: mc})
	require.NoError(t, err)
	defer restarted.Close()
	all, err := restarted.Locks.List(ctx, application.ListOptions{IncludeExpired: true})
	require.NoError(t, err)
	assert.Empty(t, all, "startup cleanup purged the dead owner's locks")
	for _, l := range held {
		got, err := restarted.Locks.Acquire(ctx, "restarted", l.Resource, 0)
		require.NoError(t, err)
		assert.Greater(t, got.Token, l.Token)
	}
}

func TestCrash_KilledMidWrite(t *testing.T) {
	rounds := 12
	if n, err := strconv.Atoi(os.Getenv(envCrashRounds)); err == nil && n > 0 {
		rounds = n
	} else if testing.Short() {
		rounds = 4
	}
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "agents.db")
	c, err := locks.Open(ctx, locks.Config{Database: db})
	require.NoError(t, err)
	require.NoError(t, c.Close())

	var seen int
	for round := range rounds {
		cmd := startWorker(t, "churn", envDB+"="+db, envOwner+fmt.Sprintf("=victim-%d", round))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		waitLine(t, bufio.NewScanner(out))
		time.Sleep(time.Duration(5+rand.IntN(60)) * time.Millisecond) // let it get into a write
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()

		// SQLite recovers the interrupted transaction on the next open.
		raw, err := sql.Open("sqlite", "file:"+db)
		require.NoError(t, err)
		var integrity string
		require.NoError(t, raw.QueryRow("PRAGMA integrity_check").Scan(&integrity))
		var rows int
		require.NoError(t, raw.QueryRow("SELECT count(*) FROM locks").Scan(&rows))
		require.NoError(t, raw.Close())
		require.Equal(t, "ok", integrity, "round %d", round)

		// Every row that survived is a whole lock the rules can read, and
		// once its TTL has passed cleanup removes it: nothing is stuck.
		mc := clock.NewMock()
		mc.Set(time.Now().Add(2 * time.Hour))
		check, err := locks.Open(ctx, locks.Config{Database: db, Clock: mc, SkipStartupCleanup: true})
		require.NoError(t, err)
		all, err := check.Locks.List(ctx, application.ListOptions{IncludeExpired: true})
		require.NoError(t, err, "round %d: every stored row parses", round)
		require.Len(t, all, rows)
		for _, l := range all {
			require.NoError(t, domain.ValidateOwner(l.Owner))
			require.NoError(t, l.Resource.Validate())
			require.True(t, l.ExpiresAt.After(l.AcquiredAt))
		}
		n, err := check.Locks.CleanupExpired(ctx)
		require.NoError(t, err)
		require.Equal(t, rows, n, "round %d: cleanup removes every lock left behind", round)
		require.NoError(t, check.Close())
		seen += rows
	}
	t.Logf("%d kills, %d locks left behind by killed processes, all readable and all purged", rounds, seen)
}
