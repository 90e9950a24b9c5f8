package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// claimRef is the resource a claim worker holds while it runs.
var claimRef = domain.ResourceRef{Type: domain.ResourcePlan, ID: "claimed"}

// claimReport is what a claim worker says on stdout once it has opened
// (and taken claimRef), or been refused.
type claimReport struct {
	Opened  bool   `json:"opened"`
	Token   int64  `json:"token"`
	InUse   bool   `json:"in_use"` // the refusal is a *domain.OwnerInUseError
	Owner   string `json:"owner"`  // the owner it names
	Message string `json:"message"`
}

// workerClaim opens the database with its owner id, takes claimRef with
// a handle, reports, and holds both until its stdin closes, then closes.
func workerClaim() int {
	ctx := context.Background()
	owner := os.Getenv(envOwner)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDB), Owner: owner})
	if err != nil {
		var inUse *domain.OwnerInUseError
		r := claimReport{Message: err.Error()}
		if errors.As(err, &inUse) {
			r.InUse, r.Owner = true, inUse.Owner
		}
		return reportJSON(r)
	}
	defer c.Close()
	l, err := c.Locks.Acquire(ctx, owner, claimRef, time.Minute)
	if err != nil {
		fmt.Fprintln(os.Stderr, "acquire:", err)
		return 1
	}
	if reportJSON(claimReport{Opened: true, Token: l.Token, Owner: owner}) != 0 {
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// claimWorker is a running claim worker and what it reported.
type claimWorker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	report claimReport
}

func startClaim(t *testing.T, db, owner string) *claimWorker {
	t.Helper()
	cmd := startWorker(t, "claim", envDB+"="+db, envOwner+"="+owner)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	w := &claimWorker{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadBytes('\n')
	require.NoError(t, err, "the claim worker said nothing")
	require.NoError(t, json.Unmarshal(line, &w.report))
	return w
}

// Two processes opened with one owner id (issue 39, item 2): the second
// Open is refused with a *domain.OwnerInUseError naming the owner, before
// it writes anything, and the first keeps its claim and its lock; once the
// first has closed, or was killed with SIGKILL, the id opens at once.
func TestOwner_SecondProcessRefused(t *testing.T) {
	for _, end := range []string{"Close", "SIGKILL"} {
		t.Run("SQLite/"+end, func(t *testing.T) { ownerRefused(t, filepath.Join(t.TempDir(), "agents.db"), end) })
		t.Run("PostgreSQL/"+end, func(t *testing.T) { ownerRefused(t, testdb.Postgres(t), end) })
	}
}

func ownerRefused(t *testing.T, db, end string) {
	const owner = "replica"
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: db, Owner: "setup"}) // the migration, out of the race
	require.NoError(t, err)
	require.NoError(t, c.Close())

	first := startClaim(t, db, owner)
	require.True(t, first.report.Opened, "the first process's Open: %s", first.report.Message)
	second := startClaim(t, db, owner)
	require.False(t, second.report.Opened, "a second process opened the database with the owner id %q of a live one", owner)
	assert.True(t, second.report.InUse, "the refusal is not a *domain.OwnerInUseError: %s", second.report.Message)
	assert.Equal(t, owner, second.report.Owner)
	assert.Contains(t, second.report.Message, `"`+owner+`"`)
	assert.Contains(t, second.report.Message, "give each process its own owner id")
	require.NoError(t, second.cmd.Wait())

	// This process is a third, and is refused too; the first still holds.
	_, err = locks.Open(ctx, locks.Config{Database: db, Owner: owner})
	var inUse *domain.OwnerInUseError
	require.ErrorAs(t, err, &inUse)
	assert.ErrorIs(t, err, domain.ErrOwnerInUse)
	assert.NotErrorIs(t, err, domain.ErrUnavailable, "a refused owner id is not a store failure")
	obs := MustOpen(t, locks.Config{Database: db, Owner: "observer"})
	held, err := obs.Locks.Get(ctx, claimRef)
	require.NoError(t, err, "the first process's lock is gone")
	assert.Equal(t, owner, held.Owner)
	assert.Equal(t, first.report.Token, held.Token)

	switch end {
	case "Close":
		require.NoError(t, first.stdin.Close())
		require.NoError(t, first.cmd.Wait())
	case "SIGKILL":
		require.NoError(t, first.cmd.Process.Kill())
		_ = first.cmd.Wait()
	}
	after, err := locks.Open(ctx, locks.Config{Database: db, Owner: owner})
	require.NoError(t, err, "the owner id stays claimed after its process ended (%s)", end)
	require.NoError(t, after.Close())
}

// Two containers of one process on one database are two claimants as
// two processes are: the second Open with the id is refused, the first's
// Close frees it at once, and other ids open beside it. ShareOwner opts
// out, and only with KeepLocksOnClose.
func TestOwner_SameProcessContainers(t *testing.T) {
	each := func(t *testing.T, db string) {
		ctx := context.Background()
		first, err := locks.Open(ctx, locks.Config{Database: db, Owner: "app"})
		require.NoError(t, err)
		defer first.Close()
		l, err := first.Locks.Acquire(ctx, "app", claimRef, time.Minute)
		require.NoError(t, err)

		_, err = locks.Open(ctx, locks.Config{Database: db, Owner: "app"})
		var inUse *domain.OwnerInUseError
		require.ErrorAs(t, err, &inUse, "a second container of this process with the same owner id")
		assert.Equal(t, "app", inUse.Owner)

		other := MustOpen(t, locks.Config{Database: db, Owner: "app-2"})
		held, err := other.Locks.Get(ctx, claimRef)
		require.NoError(t, err, "the refused Open released the first container's lock")
		assert.Equal(t, l.Token, held.Token)

		shared, err := locks.Open(ctx, locks.Config{Database: db, Owner: "app", ShareOwner: true, KeepLocksOnClose: true})
		require.NoError(t, err, "ShareOwner opens beside the claim")
		require.NoError(t, shared.Close())
		_, err = locks.Open(ctx, locks.Config{Database: db, Owner: "app", ShareOwner: true})
		var invalid *domain.ValidationError
		require.ErrorAs(t, err, &invalid, "ShareOwner without KeepLocksOnClose")
		assert.Equal(t, "ShareOwner", invalid.Field)
		_, err = other.Locks.Get(ctx, claimRef)
		require.NoError(t, err, "the sharing container's Close released the owner's lock")

		require.NoError(t, first.Close())
		again, err := locks.Open(ctx, locks.Config{Database: db, Owner: "app"})
		require.NoError(t, err, "the first container's Close did not free the owner id")
		require.NoError(t, again.Close())
	}
	t.Run("SQLite", func(t *testing.T) { each(t, filepath.Join(t.TempDir(), "agents.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { each(t, testdb.Postgres(t)) })
}

// On PostgreSQL a claim is the schema's: one owner id opens in two
// schemas of one database at once, as on two SQLite files.
func TestOwner_PostgresSchemasApart(t *testing.T) {
	first := MustOpen(t, locks.Config{Database: testdb.Postgres(t), Owner: "app"})
	second, err := locks.Open(context.Background(), locks.Config{Database: testdb.Postgres(t), Owner: "app"})
	require.NoError(t, err, "an owner id claimed in one schema was refused in another")
	require.NoError(t, second.Close())
	require.NoError(t, first.Close())
}

// Behind PgBouncer in session mode the claim is the client's session's:
// the second Open through the pooler is refused, and the first's Close
// frees the id at once (the pooler resets the server session, DISCARD
// ALL, before it serves another client), so no claim outlives its container.
func TestOwner_BehindSessionPooler(t *testing.T) {
	db := testdb.PgBouncer(t, testdb.EnvPgBouncerSession)
	ctx := context.Background()
	for range 3 {
		first, err := locks.Open(ctx, locks.Config{Database: db, Owner: "pooled"})
		require.NoError(t, err, "the owner id stayed claimed after its container closed")
		_, err = locks.Open(ctx, locks.Config{Database: db, Owner: "pooled"})
		var inUse *domain.OwnerInUseError
		require.ErrorAs(t, err, &inUse, "a second container through the pooler with the same owner id")
		require.NoError(t, first.Close())
	}
}

// A server or role that ends idle sessions (idle_session_timeout, common on
// managed PostgreSQL) must not end the claim, whose connection only idles:
// a second container would open with the id, and its Close would delete
// the first's locks.
func TestOwner_PostgresClaimOutlivesIdleSessionTimeout(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t) + "&idle_session_timeout=200"
	first := MustOpen(t, locks.Config{Database: dsn, Owner: "idle"})
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "idle"}
	_, err := first.Locks.Acquire(ctx, "idle", ref, time.Minute)
	require.NoError(t, err)
	time.Sleep(time.Second) // the server's timer, which no clock of ours moves
	second, err := locks.Open(ctx, locks.Config{Database: dsn, Owner: "idle"})
	if err == nil {
		second.Close()
	}
	require.ErrorIs(t, err, domain.ErrOwnerInUse, "a second container opened with the id after the claim's session idled out")
	_, err = first.Locks.Get(ctx, ref)
	require.NoError(t, err)
}
