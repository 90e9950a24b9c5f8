package application_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// Eight goroutines of one process share one lifecycle service, with one
// owner (c.Owner(), as docs/lifecycle.md builds it), and run 100
// transitions each on one plan: the transitions of a plan are serialised
// inside a process too, so the counter ends at exactly 800 and no call
// reports a loss (issue 19, item 3). The memory store; tests/planstore
// runs the same on SQLite and PostgreSQL.
func TestPlanLifecycleService_GoroutinesOfOneOwnerSerialise(t *testing.T) {
	defer goleak.VerifyNone(t)
	const goroutines, perGoroutine = 8, 100
	f := newPlanFixture(t, clock.New())
	s := f.lifecycle(t, "host:4242", application.PlanLockOptions{WaitTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a deadlock guard
	defer cancel()
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
				_, err := s.Transition(ctx, "p1", func(_ context.Context, p testPlan) (testPlan, error) {
					runtime.Gosched() // the work calls out: another goroutine runs meanwhile
					p.Runs++
					return p, nil
				})
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("goroutine %d, transition %d: %w", g, i, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if i == 5 {
			t.Errorf("... and %d more", len(errs)-i)
			break
		}
		t.Errorf("no transition may fail, nobody else holds the plan: %v", err)
	}
	assert.Equal(t, goroutines*perGoroutine, f.plan(t).Runs, "two transitions of one plan ran at once (%d failed)", len(errs))
}

// TransitionWithProject holds the project's lock while fn runs, and fences
// the persist with it: another transition of the same project, on another
// plan, waits until the first has persisted, and a Take of the project by
// anyone else is refused meanwhile.
func TestPlanLifecycleService_TransitionWithProjectHoldsTheProject(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	project := domain.ResourceRef{Type: domain.ResourceProject, ID: "proj"}
	f := newPlanFixture(t, testclock.New(holdStart))
	f.plans.Put("p2", testPlan{Phase: "draft"})
	first := f.lifecycle(t, "A", application.PlanLockOptions{})
	second := f.lifecycle(t, "B", application.PlanLockOptions{})

	inFirst, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	defer letGo() // a failed assertion still lets the first transition end
	firstDone := make(chan error, 1)
	go func() {
		_, err := first.TransitionWithProject(ctx, "proj", "p1", func(ctx context.Context, p testPlan) (testPlan, error) {
			close(inFirst)
			<-release
			p.Runs++
			return p, nil
		})
		firstDone <- err
	}()
	select {
	case <-inFirst:
	case err := <-firstDone:
		t.Fatalf("the first transition ended before its function ran: %v", err)
	case <-time.After(eventBound):
		t.Fatal("the first transition's function did not run")
	}

	l, err := f.locks.Get(ctx, project)
	require.NoError(t, err, "the project must be locked while TransitionWithProject's function runs")
	assert.Equal(t, "A", l.Owner)
	_, err = f.locks.Take(ctx, "C", project, application.AcquireOptions{})
	require.ErrorIs(t, err, domain.ErrConflict, "nobody else may take the project meanwhile")

	inSecond := make(chan struct{})
	secondDone := make(chan error, 1)
	go func() {
		_, err := second.TransitionWithProject(ctx, "proj", "p2", func(ctx context.Context, p testPlan) (testPlan, error) {
			close(inSecond)
			p.Runs++
			return p, nil
		})
		secondDone <- err
	}()
	deadline := time.After(eventBound)
	for f.locks.Waiting(project) == 0 {
		select {
		case <-inSecond:
			t.Fatal("a transition of the same project ran while another held the project")
		case err := <-secondDone:
			t.Fatalf("the second transition of the project returned while the first held it: %v", err)
		case <-deadline:
			t.Fatal("the second transition of the project neither waited for it nor ran")
		case <-time.After(time.Millisecond):
		}
	}
	letGo()
	require.NoError(t, <-firstDone)
	require.NoError(t, <-secondDone)
	assert.Equal(t, 1, f.plan(t).Runs)
	p2, err := f.plans.Load(ctx, "p2")
	require.NoError(t, err)
	assert.Equal(t, 1, p2.Runs)
	all, err := f.locks.List(ctx, application.ListOptions{IncludeExpired: true})
	require.NoError(t, err)
	assert.Empty(t, all, "both transitions released both their locks")
}
