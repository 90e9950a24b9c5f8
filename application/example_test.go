package application_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"runtime"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// A caller that must have the lock waits for it: Take with Wait queues
// behind the holder and takes the lock the moment the holder releases it.
// (An embedder gets its service from locks.Open; the examples build one
// on the in-memory store.)
func ExampleLockService_Take() {
	ctx := context.Background()
	svc, err := application.NewLockService(memory.NewLockRepository(), clock.New(), 0)
	if err != nil {
		log.Fatal(err)
	}
	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-42"}
	alice, err := svc.Take(ctx, "alice", plan, application.AcquireOptions{})
	if err != nil {
		log.Fatal(err)
	}

	taken := make(chan *application.Handle)
	go func() {
		bob, err := svc.Take(ctx, "bob", plan, application.AcquireOptions{Wait: true, Timeout: time.Minute})
		if err != nil {
			log.Fatal(err)
		}
		taken <- bob
	}()
	for svc.Waiting(plan) == 0 { // until bob queues
		runtime.Gosched()
	}
	if _, err := alice.Release(ctx); err != nil {
		log.Fatal(err)
	}
	bob := <-taken
	fmt.Println(bob.Lock().Owner, "holds", bob.Lock().Resource, "with token", bob.Lock().Token)
	// Output:
	// bob holds plan/plan-42 with token 2
}

// Work that outlasts a TTL keeps its lock alive and runs on the context
// that KeepAlive returns: that context ends the moment the lock is lost,
// and its cause says why. Here an operator removes the lock (as
// `agents locks release-all` would) while the work runs; the next
// renewal finds it gone. A mock clock stands in for the passing time.
func ExampleHandle_KeepAlive() {
	ctx := context.Background()
	mc := clock.NewMock()
	svc, err := application.NewLockService(memory.NewLockRepository(), mc, 0)
	if err != nil {
		log.Fatal(err)
	}
	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-42"}
	h, err := svc.Take(ctx, "worker-1", plan, application.AcquireOptions{TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	work := h.KeepAlive(ctx)

	if _, err := svc.ReleaseAllForOwner(ctx, "worker-1"); err != nil {
		log.Fatal(err)
	}
	for h.Err() == nil { // the keep-alive renews every 30s
		mc.Add(time.Second)
	}
	<-work.Done()
	var lost *domain.LockLostError
	if errors.As(context.Cause(work), &lost) {
		fmt.Println("lost:", lost.Reason)
	}
	fmt.Println(errors.Is(h.Err(), domain.ErrExpired))
	// Output:
	// lost: removed
	// true
}

// A plan transition runs under the plan's lock: load, change, persist
// fenced by the lock, release. The in-memory plan store stands in for the
// embedder's; on a database, the store's transaction checks the fence
// with Container.CheckFence.
func ExampleNewPlanLifecycleService() {
	type plan struct{ Phase string }
	ctx := context.Background()
	repo := memory.NewLockRepository()
	svc, err := application.NewLockService(repo, clock.New(), 0)
	if err != nil {
		log.Fatal(err)
	}
	plans := memory.NewPlanStore[plan](repo, clock.New())
	plans.Put("plan-42", plan{Phase: "draft"})

	lifecycle, err := application.NewPlanLifecycleService[plan](svc, plans, "worker-1",
		application.PlanLockOptions{WaitTimeout: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	p, err := lifecycle.Transition(ctx, "plan-42", func(ctx context.Context, p plan) (plan, error) {
		p.Phase = "execute"
		return p, nil
	})
	fmt.Println(p.Phase, err)

	_, err = lifecycle.Transition(ctx, "plan-42", func(ctx context.Context, p plan) (plan, error) {
		return p, errors.New("the executor is not ready")
	})
	fmt.Println(err)
	stored, err := plans.Load(ctx, "plan-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored:", stored.Phase)
	// Output:
	// execute <nil>
	// the executor is not ready
	// stored: execute
}
