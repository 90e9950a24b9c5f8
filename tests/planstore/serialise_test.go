package planstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/tests/planstore"
	"github.com/cleveragents/locks/tests/testdb"
)

// The transitions of one plan are serialised inside a process as well as
// between processes, with the service built as docs/lifecycle.md shows
// it: one PlanLifecycleService, owner c.Owner(), shared by every
// goroutine of the process (issue 19, item 3).

// incrementSlowly is increment, yielding in the middle of the work, as a
// transition that calls out does: another goroutine then runs while this
// one holds the plan.
func incrementSlowly(ctx context.Context, p planstore.Plan) (planstore.Plan, error) {
	runtime.Gosched()
	p.Phase = "counted"
	p.Counter++
	return p, nil
}

// runTransitions runs perGoroutine transitions of plan id from each of
// goroutines goroutines on svc, and returns every error.
func runTransitions(ctx context.Context, svc *application.PlanLifecycleService[planstore.Plan], id string, goroutines, perGoroutine int) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perGoroutine {
				if _, err := svc.Transition(ctx, id, incrementSlowly); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("goroutine %d, transition %d: %w", g, i, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errs
}

func TestPlanLifecycle_GoroutinesOfOneOwnerSerialise(t *testing.T) {
	eachDatabase(t, func(t *testing.T, database string) {
		const goroutines, perGoroutine = 8, 100
		// The bound is a deadlock guard, far above what the transitions need.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c := mustOpen(t, database, "", nil)
		plans := mustPlans(t, database, c)
		svc, err := application.NewPlanLifecycleService[planstore.Plan](c.Locks, plans, c.Owner(),
			application.PlanLockOptions{WaitTimeout: time.Minute})
		require.NoError(t, err)

		errs := runTransitions(ctx, svc, plan1.ID, goroutines, perGoroutine)
		for i, err := range errs {
			if i == 5 {
				t.Errorf("... and %d more", len(errs)-i)
				break
			}
			t.Errorf("a transition failed (no call may report a loss: nobody else holds the plan): %v", err)
		}
		got := mustLoad(t, plans, plan1.ID).Counter
		assert.EqualValues(t, goroutines*perGoroutine, got,
			"every transition's increment must persist: two transitions of one plan never run at once (%d failed)", len(errs))
		t.Logf("%d goroutines x %d transitions of one owner: counter %d, %d errors", goroutines, perGoroutine, got, len(errs))
	})
}

// workerCountShared is the worker of TestPlanLifecycle_ProcessesOfSharedOwners:
// it opens the container with its default owner and runs the transitions
// from two goroutines sharing one service of owner c.Owner().
func workerCountShared() int {
	ctx := context.Background()
	database := os.Getenv(envDatabase)
	n, _ := strconv.Atoi(os.Getenv(envTransitions))
	c, err := locks.Open(ctx, locks.Config{Database: database})
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
	svc, err := application.NewPlanLifecycleService[planstore.Plan](c.Locks, plans, c.Owner(),
		application.PlanLockOptions{WaitTimeout: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, "service:", err)
		return 1
	}
	st := countStats{Owner: c.Owner()}
	errs := runTransitions(ctx, svc, sharedPlan, 2, n/2)
	st.Done = n - len(errs)
	for _, err := range errs {
		st.Errors = append(st.Errors, err.Error())
	}
	if err := json.NewEncoder(os.Stdout).Encode(st); err != nil {
		return 1
	}
	return 0
}

// Four processes, each with two goroutines sharing its default owner, run
// 200 transitions each on one plan: the counter ends at exactly 800.
func TestPlanLifecycle_ProcessesOfSharedOwners(t *testing.T) {
	run := func(t *testing.T, database string) {
		const procs, perProc = 4, 200
		ctx := context.Background()
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
			cmd.Env = append(os.Environ(), envWorker+"=count-shared", envDatabase+"="+database,
				envTransitions+"="+strconv.Itoa(perProc))
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
			for i, e := range st.Errors {
				if i == 3 {
					t.Errorf("%s: ... and %d more", st.Owner, len(st.Errors)-i)
					break
				}
				t.Errorf("%s: a transition failed: %s", st.Owner, e)
			}
			done += st.Done
		}
		final := mustLoad(t, plans, sharedPlan)
		assert.Equal(t, procs*perProc, done, "every transition completed")
		assert.EqualValues(t, procs*perProc, final.Counter, "no lost update, between processes or inside one")
		t.Logf("%d processes x %d transitions (2 goroutines each, owner c.Owner()): counter %d, %d completed",
			procs, perProc, final.Counter, done)
	}
	t.Run("SQLite", func(t *testing.T) { run(t, filepath.Join(t.TempDir(), "agents.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { run(t, testdb.Postgres(t)) })
}
