//go:build unix

package pgfault

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/tests/pgserver"
)

// TestFault_ProcessesMigrateOnce starts N processes at the same instant
// against an empty database: each opens a container, takes and releases
// a lock of its own, and closes. Every process succeeds; the server's log
// of DDL shows the locks table created exactly once; the module's version
// table records each migration once.
func TestFault_ProcessesMigrateOnce(t *testing.T) {
	const processes = 8
	s := pgserver.Start(t, "log_statement=ddl")
	dsn := s.CreateDatabase("fresh")

	start := time.Now().Add(2 * time.Second) // after every process has loaded
	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, processes)
	errs := make([]error, processes)
	for i := range processes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envWorker+"=open", envDSN+"="+dsn,
				envOwner+"="+fmt.Sprintf("proc-%d", i), fmt.Sprintf("%s=%d", envStart, start.UnixNano()))
			cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
			cmd.WaitDelay = time.Second
			// Bounded: a process stuck on the migration lock fails the test.
			timer := time.AfterFunc(3*time.Minute, func() { cmd.Process.Kill() })
			defer timer.Stop()
			errs[i] = cmd.Run()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "process %d: %s", i, outs[i].String())
	}

	admin := s.Open("fresh")
	require.Equal(t, migrations(t), versions(t, admin), "each migration is recorded once")
	require.Empty(t, lockRows(t, admin), "every process released its lock")
	var legacy bool
	require.NoError(t, admin.QueryRow("SELECT to_regclass('goose_db_version') IS NOT NULL").Scan(&legacy))
	require.False(t, legacy, "no table of goose's default name")
	var indexes int
	require.NoError(t, admin.QueryRow("SELECT count(*) FROM pg_indexes WHERE tablename = 'locks'").Scan(&indexes))
	require.Equal(t, 4, indexes, "the primary key and the three indexes of the migration")

	// Processes that lost the race waited for the migration and did not
	// run it: the server saw the DDL once.
	log := s.Log()
	require.Equal(t, 1, strings.Count(log, `CREATE TABLE "locks"`), "the locks table is created once:\n%s", log)
	require.Equal(t, 1, strings.Count(log, `CREATE UNIQUE INDEX "lock_resource_type_resource_id"`))
}
