package planstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/planstore"
)

// Plan transitions run under the plan's lock, and persist through a plan
// store whose transaction checks the lock's fence before it writes. The
// plans live in the same database as the locks.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "lifecycle")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	database := filepath.Join(dir, "agents.db") // or a postgres:// DSN

	c, err := locks.Open(ctx, locks.Config{Database: database, Owner: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	plans, err := planstore.Open(ctx, database, c.CheckFence)
	if err != nil {
		log.Fatal(err)
	}
	defer plans.Close()
	if err := plans.Create(ctx, planstore.Plan{ID: "plan-42", Phase: "draft"}); err != nil {
		log.Fatal(err)
	}

	svc, err := application.NewPlanLifecycleService[planstore.Plan](c.Locks, plans, c.Owner(),
		application.PlanLockOptions{WaitTimeout: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	// Lock, load, run the function (keeping the lock alive), persist
	// fenced, release.
	p, err := svc.Transition(ctx, "plan-42", func(ctx context.Context, p planstore.Plan) (planstore.Plan, error) {
		p.Phase = "execute"
		p.Counter++
		return p, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("phase", p.Phase, "counter", p.Counter)

	// A transition that changes the project as well takes the project's
	// lock, then the plan's, and both fence the write.
	_, err = svc.TransitionWithProject(ctx, "apollo", "plan-42", func(ctx context.Context, p planstore.Plan) (planstore.Plan, error) {
		p.Phase = "done"
		p.Counter++
		return p, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	stored, err := plans.Load(ctx, "plan-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("phase", stored.Phase, "counter", stored.Counter, "written under plan lock token", stored.Token)
	// Output:
	// phase execute counter 1
	// phase done counter 2 written under plan lock token 3
}

// A holder that stalls past its lock's expiry while another owner takes
// the plan must not write over the new holder's work: its fenced write is
// refused, names the new holder, and writes nothing. A mock clock makes
// the stall.
func Example_staleHolder() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "lifecycle")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	database := filepath.Join(dir, "agents.db")
	mc := clock.NewMock()
	c, err := locks.Open(ctx, locks.Config{Database: database, Clock: mc, LocalTime: true})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	plans, err := planstore.Open(ctx, database, c.CheckFence)
	if err != nil {
		log.Fatal(err)
	}
	defer plans.Close()
	if err := plans.Create(ctx, planstore.Plan{ID: "plan-42", Phase: "draft"}); err != nil {
		log.Fatal(err)
	}

	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-42"}
	stalled, err := c.Locks.Acquire(ctx, "worker-1", ref, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	mc.Add(2 * time.Minute) // worker-1 stalls; its lock expires
	if _, err := c.Locks.Acquire(ctx, "worker-2", ref, time.Minute); err != nil {
		log.Fatal(err)
	}

	err = plans.Persist(ctx, "plan-42", planstore.Plan{Phase: "stale"}, []application.Fence{application.FenceOf(stalled)})
	var lost *domain.LockLostError
	if errors.As(err, &lost) {
		fmt.Println("refused:", lost.Reason, "by", lost.NewHolder.Owner)
	}
	stored, err := plans.Load(ctx, "plan-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the plan is still", stored.Phase)
	// Output:
	// refused: taken over by worker-2
	// the plan is still draft
}
