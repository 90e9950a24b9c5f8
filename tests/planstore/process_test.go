package planstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/tests/planstore"
	"github.com/cleveragents/locks/tests/testdb"
)

// Four OS processes each run transitions through locks.Open and the
// lifecycle service with the SQL store, every one incrementing the counter
// of one plan. The worker side runs when the test binary is re-executed
// with envWorker set; see TestMain.

const (
	envWorker      = "LOCKS_TEST_PLAN_WORKER"
	envDatabase    = "LOCKS_TEST_PLAN_DB"
	envOwner       = "LOCKS_TEST_PLAN_OWNER"
	envTransitions = "LOCKS_TEST_PLAN_TRANSITIONS"

	sharedPlan    = "shared-plan"
	sharedProject = "shared-project"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envWorker) {
	case "":
		goleak.VerifyTestMain(m)
	case "count":
		os.Exit(workerCount())
	case "count-shared":
		os.Exit(workerCountShared())
	default:
		fmt.Fprintln(os.Stderr, "unknown worker", os.Getenv(envWorker))
		os.Exit(2)
	}
}

// countStats is what a counting worker reports on stdout.
type countStats struct {
	Owner  string   `json:"owner"`
	Done   int      `json:"done"`
	Errors []string `json:"errors"`
}

// workerCount runs the transitions, every other one with the project lock
// too, and reports how many were persisted.
func workerCount() int {
	ctx := context.Background()
	database, owner := os.Getenv(envDatabase), os.Getenv(envOwner)
	n, _ := strconv.Atoi(os.Getenv(envTransitions))
	st := countStats{Owner: owner}
	c, err := locks.Open(ctx, locks.Config{Database: database, Owner: owner})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer c.Close()
	plans, err := planstore.Open(ctx, database, c.CheckFence)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open plans:", err)
		return 1
	}
	defer plans.Close()
	svc, err := application.NewPlanLifecycleService[planstore.Plan](c.Locks, plans, owner,
		application.PlanLockOptions{WaitTimeout: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, "service:", err)
		return 1
	}
	for i := range n {
		if i%2 == 0 {
			_, err = svc.Transition(ctx, sharedPlan, increment("plan-only"))
		} else {
			_, err = svc.TransitionWithProject(ctx, sharedProject, sharedPlan, increment("with-project"))
		}
		if err != nil {
			st.Errors = append(st.Errors, err.Error())
			continue
		}
		st.Done++
	}
	if err := json.NewEncoder(os.Stdout).Encode(st); err != nil {
		return 1
	}
	return 0
}

func TestPlanLifecycle_ProcessesLoseNoUpdate(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) { runCounters(t, filepath.Join(t.TempDir(), "agents.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { runCounters(t, testdb.Postgres(t)) })
}

func runCounters(t *testing.T, database string) {
	const procs = 4
	perProc := 40
	if testing.Short() {
		perProc = 10
	}
	ctx := context.Background()
	// Create the lock table, the plans table and the plan first, so that
	// the workers race on the plan, not on the migration.
	c, err := locks.Open(ctx, locks.Config{Database: database})
	require.NoError(t, err)
	plans, err := planstore.Open(ctx, database, c.CheckFence)
	require.NoError(t, err)
	defer plans.Close()
	require.NoError(t, plans.Create(ctx, planstore.Plan{ID: sharedPlan, Phase: "draft"}))
	require.NoError(t, c.Close())

	var (
		wg    sync.WaitGroup
		stats = make([]countStats, procs)
	)
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envWorker+"=count", envDatabase+"="+database,
			envOwner+"=proc-"+strconv.Itoa(i), envTransitions+"="+strconv.Itoa(perProc))
		cmd.Stderr = os.Stderr
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
	wg.Wait()

	done := 0
	for _, st := range stats {
		assert.Empty(t, st.Errors, "%s: transitions failed", st.Owner)
		done += st.Done
	}
	final := mustLoad(t, plans, sharedPlan)
	assert.Equal(t, procs*perProc, done, "every transition completed")
	assert.EqualValues(t, done, final.Counter, "the counter must count every persisted transition: no lost update")
	t.Logf("%d processes x %d transitions: counter %d", procs, perProc, final.Counter)
}
