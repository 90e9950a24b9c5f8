package application_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// slowRepo returns from each Update a little after its decision, in real
// time: the window between a waiter's look at the clock and the timer it
// then sets, which a test's move of the clock may fall into.
type slowRepo struct {
	*memory.LockRepository
	after time.Duration
}

func (r slowRepo) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	l, err := r.LockRepository.Update(ctx, ref, decide)
	time.Sleep(r.after)
	return l, err
}

// untilParked waits in real time until svc says n callers wait for ref.
func untilParked(t *testing.T, svc *application.LockService, ref domain.ResourceRef, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); svc.Waiting(ref) != n; runtime.Gosched() {
		require.True(t, time.Now().Before(deadline), "Waiting(%s) is %d, never %d", ref, svc.Waiting(ref), n)
	}
}

// The waiter behind a head that times out is counted while it waits for
// its turn; the move that times the head out makes it the head, and it
// reads the clock for its first look while the test's next move may be
// under way. Once Waiting said 1, that next move reaches it: it does not
// set its timer from the instant before the move.
func TestLockService_Waiting_BehindAHeadThatTimesOut(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(holdStart)
	svc := newHoldService(t, slowRepo{memory.NewLockRepository(), 5 * time.Millisecond}, clk)
	for i := range 20 {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "behind-" + string(rune('a'+i))}
		_, err := svc.Acquire(ctx, "other", ref, 30*time.Second)
		require.NoError(t, err)
		head, behind := make(chan error, 1), make(chan error, 1)
		do := func(out chan<- error, timeout time.Duration) {
			out <- svc.Do(ctx, "me", ref, application.AcquireOptions{Wait: true, Timeout: timeout},
				func(context.Context, domain.Lock) error { return nil })
		}
		go do(head, 10*time.Second)
		untilParked(t, svc, ref, 1)
		go do(behind, 0)
		untilParked(t, svc, ref, 2)
		clk.Add(10 * time.Second) // the head times out; the other comes to the head
		untilParked(t, svc, ref, 1)
		time.Sleep(2 * time.Millisecond) // a test may move the clock at any time after
		clk.Add(25 * time.Second)        // 5s past the holder's expiry
		select {
		case err := <-behind:
			require.NoError(t, err, "round %d", i)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: hung; Waiting=%d, timers pending: %v", i, svc.Waiting(ref), clk.PendingIn())
		}
		require.ErrorIs(t, <-head, context.DeadlineExceeded)
	}
}

// hookRepo runs onConflict once, after the first Update that the lock's
// holder refuses, before it returns: a test's move of the clock that
// lands between a waiter's look and its next decision.
type hookRepo struct {
	*memory.LockRepository
	once       sync.Once
	onConflict func()
}

func (r *hookRepo) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	l, err := r.LockRepository.Update(ctx, ref, decide)
	if conflict := (*domain.LockConflictError)(nil); errors.As(err, &conflict) && r.onConflict != nil {
		r.once.Do(r.onConflict)
	}
	return l, err
}

// switchedProcesses says every process is alive until gone is set.
type switchedProcesses struct{ gone atomic.Bool }

func (p *switchedProcesses) Gone(domain.ProcessOwner) bool { return p.gone.Load() }

// A waiter whose look finds the holder's process gone, while a move past
// its Timeout lands before the takeover, times out: the lock stays the
// dead holder's, and no observer hears of a takeover.
func TestLockService_Waiting_DeadHolderAtTheDeadline(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(holdStart)
	dead := domain.ProcessOwner{Host: "h", PID: 7, Nonce: "0a1b2c3d",
		BootID: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", PIDNamespace: 1, StartTime: 9}.String()
	repo := &hookRepo{LockRepository: memory.NewLockRepository()}
	procs := &switchedProcesses{}
	rec := &syncRecorder{}
	svc, err := application.NewLockService(repo, clk, 0, application.WithProcesses(procs), application.WithObserver(rec))
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, dead, plan, time.Hour)
	require.NoError(t, err)
	out := make(chan taken, 1)
	takeAsync(svc, "B", application.AcquireOptions{Wait: true, Timeout: 10 * time.Second}, out)
	untilParked(t, svc, plan, 1)

	procs.gone.Store(true)
	repo.onConflict = func() { clk.Add(15 * time.Second) } // past the Timeout, before the takeover
	other := domain.ResourceRef{Type: domain.ResourcePlan, ID: "other"}
	_, err = svc.Acquire(ctx, "C", other, time.Hour)
	require.NoError(t, err)
	_, err = svc.ReleaseAllForOwner(ctx, "C") // wakes every head waiter: it looks
	require.NoError(t, err)
	got := <-out
	require.ErrorIs(t, got.err, context.DeadlineExceeded)
	l, err := svc.Get(ctx, plan)
	require.NoError(t, err)
	assert.Equal(t, dead, l.Owner, "the lock is still the dead holder's")
	for _, e := range rec.all() {
		assert.NotEqual(t, application.EventTakenOver, e.Kind, "no takeover happened: %+v", e)
	}
}

type syncRecorder struct {
	mu     sync.Mutex
	events []application.Event
}

func (r *syncRecorder) Observe(_ context.Context, e application.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *syncRecorder) all() []application.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]application.Event(nil), r.events...)
}

// A waiter behind a holder, begun while the clock reads between two
// microseconds, wakes when a test moves the clock exactly to the
// holder's expiry: its timer lands on the expiry, not after it.
func TestLockService_Waiting_ToAnExpiryBetweenMicroseconds(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(holdStart)
	svc := newHoldService(t, memory.NewLockRepository(), clk)
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "between"}
	h, err := svc.Take(ctx, "other", ref, application.AcquireOptions{TTL: 30 * time.Second})
	require.NoError(t, err)
	held := h.Lock()
	clk.Add(held.ExpiresAt.Add(-10*time.Millisecond + 500*time.Nanosecond).Sub(clk.Now())) // nearer than any backoff
	got := make(chan error, 1)
	go func() {
		got <- svc.Do(ctx, "me", ref, application.AcquireOptions{Wait: true},
			func(context.Context, domain.Lock) error { return nil })
	}()
	untilParked(t, svc, ref, 1)
	clk.Add(held.ExpiresAt.Sub(clk.Now()))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatalf("hung at the holder's expiry; Waiting=%d, timers pending: %v", svc.Waiting(ref), clk.PendingIn())
	}
}
