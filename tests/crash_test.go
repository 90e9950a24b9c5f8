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
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// workerChurn takes locks and reports them (mode "hold-locks"), or churns
// through every write the service has until it is killed.
func workerChurn() int {
	if os.Getenv(envDuration) == "hold-locks" {
		return workerHoldLocks()
	}
	ctx := context.Background()
	owner := os.Getenv(envOwner)
	// The stack that locks.Open builds for a SQLite file, with the
	// repository wrapped so that the parent can see where the writes are.
	db, err := sqlite.Open(ctx, os.Getenv(envDB), sqlite.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	svc, err := application.NewLockService(writeMarks{sqlite.NewLockRepository(db)}, clock.New(), 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "service:", err)
		return 1
	}
	fmt.Println("churning")
	for i := 0; ; i++ {
		ref := stressResources[rand.IntN(len(stressResources))]
		switch i % 5 {
		case 0, 1:
			svc.Acquire(ctx, owner, ref, time.Duration(5+rand.IntN(55))*time.Second)
		case 2:
			svc.Renew(ctx, owner, ref, 0)
		case 3:
			svc.Release(ctx, owner, ref)
		case 4:
			if i%20 == 4 {
				svc.ReleaseAllForOwner(ctx, owner)
			} else {
				svc.CleanupExpired(ctx)
			}
		}
	}
}

// workerHoldLocks takes a lock on every stress resource, reports them and
// waits to be killed.
func workerHoldLocks() int {
	ctx := context.Background()
	owner := os.Getenv(envOwner)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: owner, KeepLocksOnClose: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
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
	waitToBeKilled()
	return 0
}

// The marks a churning worker writes on stdout, one byte each, unbuffered:
// markWrite when an Update has decided to write (its transaction is open,
// the row about to be written and committed), markDone when that Update
// has returned. A worker whose last mark is markWrite died in the middle
// of a write.
const (
	markWrite = 'w'
	markDone  = 'd'
)

// writeMarks is a lock repository that writes the marks around the writes
// of Update (acquire and renew). The other writes (release, cleanup) go
// unmarked, so that a kill during one of them is not counted.
type writeMarks struct{ application.LockRepository }

func (r writeMarks) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	writing := false
	l, err := r.LockRepository.Update(ctx, ref, func(cur *domain.Lock) (application.Change, error) {
		ch, err := decide(cur)
		if err == nil && ch.Kind != application.ChangeNone && !writing {
			writing = true
			os.Stdout.Write([]byte{markWrite})
		}
		return ch, err
	})
	if writing {
		os.Stdout.Write([]byte{markDone})
	}
	return l, err
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
	waitToBeKilled()
	return 0
}

// waitToBeKilled blocks until the process is killed. Not with select {}:
// in a binary built without cgo (CGO_ENABLED=0, the default where no C
// compiler is installed), the runtime then finds every goroutine asleep
// and exits with "all goroutines are asleep - deadlock!", which ends the
// worker, and its transaction, at once. A pending timer keeps the
// runtime from calling that a deadlock.
func waitToBeKilled() {
	for {
		time.Sleep(time.Hour)
	}
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
	survivor, err := locks.Open(ctx, locks.Config{Database: db, Owner: "survivor", Clock: mc, LocalTime: true})
	require.NoError(t, err)
	defer survivor.Close()
	for _, l := range held {
		_, err := survivor.Locks.Acquire(ctx, "survivor", l.Resource, 0)
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce, "refused while the dead owner's TTL runs")
		assert.Equal(t, "doomed", ce.Holder.Owner)
	}

	mc.Set(held[len(held)-1].ExpiresAt)
	restarted, err := locks.Open(ctx, locks.Config{Database: db, Owner: "restarted", Clock: mc, LocalTime: true})
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

	// A kill that lands between two writes tests nothing: go on past the
	// rounds asked for until at least one kill has landed mid-write.
	var seen, midWrite, writes int
	round := 0
	for ; round < rounds || (midWrite == 0 && round < 10*rounds); round++ {
		cmd := startWorker(t, "churn", envDB+"="+db, envOwner+fmt.Sprintf("=victim-%d", round))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		br := bufio.NewReader(out)
		line, err := br.ReadString('\n')
		require.NoError(t, err, "the worker exited early")
		require.Equal(t, "churning\n", line)
		// Read the marks until the worker's death closes the pipe.
		type marks struct {
			last   byte
			writes int
		}
		got := make(chan marks, 1)
		go func() {
			var m marks
			for {
				b, err := br.ReadByte()
				if err != nil {
					got <- m
					return
				}
				m.last = b
				if b == markDone {
					m.writes++
				}
			}
		}()
		time.Sleep(time.Duration(5+rand.IntN(60)) * time.Millisecond) // let it get into a write
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		m := <-got
		_ = cmd.Wait()
		writes += m.writes
		if m.last == markWrite {
			midWrite++
		}

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
		check, err := locks.Open(ctx, locks.Config{Database: db, Clock: mc, LocalTime: true, SkipStartupCleanup: true})
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
	t.Logf("%d kills, %d of them mid-write, after %d marked writes had returned; %d locks left behind by killed processes, all readable and all purged",
		round, midWrite, writes, seen)
	require.NotZero(t, midWrite, "none of %d kills landed while a write was in progress: crash recovery was not exercised", round)
}
