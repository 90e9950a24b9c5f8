//go:build unix

// Package pgfault tests the lock module on PostgreSQL under faults: a
// connection killed mid-transaction, a server restarting under a container
// in use, statement and lock timeouts, and processes that migrate an empty
// database at once. Each test starts a private server (package pgserver),
// so that killing or restarting it disturbs no other test.
//
// The worker side of the multi-process test runs when the test binary is
// re-executed with envWorker set; see TestMain.
package pgfault

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

const (
	envWorker = "LOCKS_PGFAULT_WORKER"
	envDSN    = "LOCKS_PGFAULT_DSN"
	envOwner  = "LOCKS_PGFAULT_OWNER"
	envStart  = "LOCKS_PGFAULT_START" // when to open, in Unix nanoseconds
)

func TestMain(m *testing.M) {
	switch os.Getenv(envWorker) {
	case "":
		os.Exit(m.Run())
	case "open":
		os.Exit(workerOpen())
	default:
		fmt.Fprintln(os.Stderr, "unknown worker", os.Getenv(envWorker))
		os.Exit(2)
	}
}

// call bounds one call of a test on the store: long enough for a loaded
// machine, short enough that a hang fails the test.
const call = 30 * time.Second

// openContainer opens a container on dsn, closed when the test ends.
func openContainer(t *testing.T, dsn, owner string) *locks.Container {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), call)
	defer cancel()
	c, err := locks.Open(ctx, locks.Config{Database: dsn, Owner: owner})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// requireStoreError asserts that err is a *domain.StoreError of one of
// kinds that matches domain.ErrUnavailable.
func requireStoreError(t *testing.T, err error, kinds ...domain.StoreErrorKind) {
	t.Helper()
	require.Error(t, err)
	var se *domain.StoreError
	require.True(t, errors.As(err, &se), "want a *domain.StoreError, got %T: %v", err, err)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	require.True(t, slices.Contains(kinds, se.Kind), "want a store error of kind %v, got %v: %v", kinds, se.Kind, err)
}

// lockRow is a row of the locks table, as stored.
type lockRow struct {
	Token         int64
	Owner, Type   string
	ID            string
	Acquired, Exp string
}

// storedRow returns l as the locks table stores it.
func storedRow(l domain.Lock) lockRow {
	const layout = "2006-01-02T15:04:05.000000Z"
	return lockRow{l.Token, l.Owner, string(l.Resource.Type), l.Resource.ID,
		l.AcquiredAt.UTC().Format(layout), l.ExpiresAt.UTC().Format(layout)}
}

// lockRows reads the locks table past the store.
func lockRows(t *testing.T, db *sql.DB) []lockRow {
	t.Helper()
	rows, err := db.Query("SELECT id, owner_id, resource_type, resource_id, acquired_at, expires_at FROM locks ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var out []lockRow
	for rows.Next() {
		var r lockRow
		require.NoError(t, rows.Scan(&r.Token, &r.Owner, &r.Type, &r.ID, &r.Acquired, &r.Exp))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// versions reads the applied migrations of the module's version table.
func versions(t *testing.T, db *sql.DB) []int64 {
	t.Helper()
	rows, err := db.Query("SELECT version_id FROM locks_schema_version WHERE is_applied ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		out = append(out, v)
	}
	require.NoError(t, rows.Err())
	return out
}

// migrations returns the versions the module's version table records
// once every migration of the PostgreSQL adapter is applied: goose's
// initial 0, then the version of each file.
func migrations(t *testing.T) []int64 {
	t.Helper()
	files, err := filepath.Glob("../../adapters/postgres/migrations/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	out := []int64{0}
	for _, f := range files {
		v, err := strconv.ParseInt(strings.SplitN(filepath.Base(f), "_", 2)[0], 10, 64)
		require.NoError(t, err, f)
		out = append(out, v)
	}
	return out
}

// plan is a resource of the tests.
func plan(id string) domain.ResourceRef { return domain.ResourceRef{Type: domain.ResourcePlan, ID: id} }

// workerOpen opens a container at the agreed instant, takes and releases a
// lock of its own, and closes: one of the processes that start together
// against an empty database.
func workerOpen() int {
	var start int64
	fmt.Sscan(os.Getenv(envStart), &start)
	time.Sleep(time.Until(time.Unix(0, start)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	owner := os.Getenv(envOwner)
	c, err := locks.Open(ctx, locks.Config{Database: os.Getenv(envDSN), Owner: owner})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer c.Close()
	if _, err := c.Locks.Acquire(ctx, owner, plan("own-"+owner), time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "acquire:", err)
		return 1
	}
	if ok, err := c.Locks.Release(ctx, owner, plan("own-"+owner)); err != nil || !ok {
		fmt.Fprintln(os.Stderr, "release:", ok, err)
		return 1
	}
	return 0
}
