package application_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// fakeQueue is a Queue whose places the test sees and puts ahead or not.
type fakeQueue struct {
	*fakeWakeups
	mu     sync.Mutex
	ahead  int             // what every place's Ahead answers
	calls  int             // Joins begun
	places []*fakePlace    // in the order Join returned them
	joined chan *fakePlace // receives each place as Join returns it
	hold   func(n int)     // called in Join before its place is numbered
}

type fakePlace struct {
	q      *fakeQueue
	n      int
	left   chan bool // receives Leave's took
	leaves int
}

func newFakeQueue() *fakeQueue {
	return &fakeQueue{fakeWakeups: newFakeWakeups(true), joined: make(chan *fakePlace, 16)}
}

func (q *fakeQueue) Join(context.Context, domain.ResourceRef) (application.Place, bool, error) {
	q.mu.Lock()
	calls := q.calls
	q.calls++
	q.mu.Unlock()
	if q.hold != nil {
		q.hold(calls)
	}
	q.mu.Lock()
	p := &fakePlace{q: q, n: len(q.places), left: make(chan bool, 1)}
	q.places = append(q.places, p)
	ahead := q.ahead
	q.mu.Unlock()
	q.joined <- p
	return p, ahead > 0, nil
}

func (q *fakeQueue) setAhead(a int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ahead = a
}

func (p *fakePlace) Ahead(context.Context) (int, error) {
	p.q.mu.Lock()
	defer p.q.mu.Unlock()
	return p.q.ahead, nil
}

func (p *fakePlace) Leave(took bool) {
	p.q.mu.Lock()
	p.leaves++
	p.q.mu.Unlock()
	p.left <- took
}

// A waiter with a place of another process ahead of it does not take the
// lock when it comes free; once nobody is ahead it does, and it leaves
// its place once, with the lock. One that gives up leaves without it.
func TestLockService_QueueAcrossProcesses(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	wait := application.AcquireOptions{Wait: true, TTL: time.Minute}

	t.Run("AheadHoldsBackTheTry", func(t *testing.T) {
		clk := testclock.New(holdStart)
		repo := memory.NewLockRepository()
		holder, err := newHoldService(t, repo, clk).Take(ctx, "A", plan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		q := newFakeQueue()
		q.setAhead(1)
		svc := newHoldService(t, repo, clk, application.WithWakeups(q))
		out := make(chan taken, 1)
		takeAsync(svc, "B", wait, out)
		p := <-q.joined
		require.Equal(t, plan, <-q.watched) // asleep behind the place ahead, watching
		_, err = holder.Release(ctx)
		require.NoError(t, err)
		q.wake()
		clk.NextTimer(t) // looked, and asleep again: the place is still ahead
		_, err = repo.Get(ctx, plan)
		require.ErrorIs(t, err, domain.ErrNotFound, "taken while a waiter of another process was ahead")

		q.setAhead(0) // it left
		q.wake()
		got := <-out
		require.NoError(t, got.err)
		assert.Equal(t, "B", got.h.Lock().Owner)
		assert.True(t, <-p.left, "left without the lock")
		_, err = got.h.Release(ctx)
		require.NoError(t, err)
		q.mu.Lock()
		assert.Equal(t, 1, p.leaves)
		q.mu.Unlock()
	})

	t.Run("StuckWaitersAheadPassedInTurn", func(t *testing.T) {
		// Three live places ahead that never take the free lock (paused
		// processes): the waiter passes them once its fallback looks have
		// found the lock free for three fallback periods, one per place, so
		// that a waiter behind one stuck place passes it before a waiter
		// behind more does.
		clk := testclock.New(holdStart)
		repo := memory.NewLockRepository()
		holder, err := newHoldService(t, repo, clk).Take(ctx, "A", plan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		q := newFakeQueue()
		q.setAhead(3)
		svc := newHoldService(t, repo, clk, application.WithWakeups(q))
		out := make(chan taken, 1)
		takeAsync(svc, "B", wait, out)
		p := <-q.joined
		require.Equal(t, plan, <-q.watched)
		_, err = holder.Release(ctx)
		require.NoError(t, err)
		q.wake()
		var firstLook time.Time // the first fallback look that found the lock free
		deadline := time.After(10 * time.Second)
		for {
			select {
			case got := <-out:
				require.NoError(t, got.err)
				require.False(t, firstLook.IsZero(), "passed the places ahead without a fallback look")
				free := clk.Now().Sub(firstLook)
				assert.GreaterOrEqual(t, free, 3*time.Second, "passed three places ahead before the lock stood free three fallback periods")
				assert.Less(t, free, 5*time.Second, "passed them long after the lock stood free three fallback periods")
				assert.True(t, <-p.left, "left without the lock")
				_, err = got.h.Release(ctx)
				require.NoError(t, err)
				return
			case d := <-clk.Timers():
				clk.Add(d)
				if firstLook.IsZero() {
					firstLook = clk.Now()
				}
			case <-deadline:
				t.Fatal("the waiter never passed the places ahead of it, though the lock stood free")
			}
		}
	})

	t.Run("GivingUpLeavesWithoutTheLock", func(t *testing.T) {
		clk := testclock.New(holdStart)
		repo := memory.NewLockRepository()
		_, err := newHoldService(t, repo, clk).Take(ctx, "A", plan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		q := newFakeQueue()
		q.setAhead(1)
		svc := newHoldService(t, repo, clk, application.WithWakeups(q))
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := svc.Take(wctx, "B", plan, wait)
			done <- err
		}()
		p := <-q.joined
		clk.NextTimer(t)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.False(t, <-p.left, "a waiter that gave up left as if it had the lock")
	})

	t.Run("PlacesInTheOrderOfThisProcesssQueue", func(t *testing.T) {
		// The first waiter's place is slow to come: the second, queued
		// behind it here, must not take an earlier place, or the first
		// would wait for another process's waiter that waits for the second.
		clk := testclock.New(holdStart)
		repo := memory.NewLockRepository()
		holder, err := newHoldService(t, repo, clk).Take(ctx, "A", plan, application.AcquireOptions{TTL: time.Hour})
		require.NoError(t, err)
		q := newFakeQueue()
		second, holding := make(chan struct{}), make(chan struct{})
		q.hold = func(calls int) {
			if calls == 0 {
				close(holding)
				select {
				case <-second: // the second waiter asks for a place meanwhile
				case <-time.After(200 * time.Millisecond): // it cannot, until this one has its own
				}
			} else {
				close(second)
			}
		}
		svc := newHoldService(t, repo, clk, application.WithWakeups(q))
		out := make(chan taken, 2)
		takeAsync(svc, "B", wait, out)
		<-holding // B is queued here, and asks for its place
		takeAsync(svc, "C", wait, out)
		a, b := <-q.joined, <-q.joined
		_, err = holder.Release(ctx)
		require.NoError(t, err)
		q.wake()
		got := <-out
		require.NoError(t, got.err)
		assert.Equal(t, "B", got.owner, "this process's queue is served in order")
		// B's place is the one left with the lock.
		var placeB, placeC *fakePlace
		select {
		case took := <-a.left:
			assert.True(t, took)
			placeB, placeC = a, b
		case took := <-b.left:
			assert.True(t, took)
			placeB, placeC = b, a
		}
		_, err = got.h.Release(ctx)
		require.NoError(t, err)
		got = <-out
		require.NoError(t, got.err)
		_, err = got.h.Release(ctx)
		require.NoError(t, err)
		assert.True(t, <-placeC.left)
		assert.Less(t, placeOf(q, placeB), placeOf(q, placeC), "the first waiter here took a later place than the one behind it")
	})
}

// placeOf is the number of p among q's places: the order Join numbered it in.
func placeOf(q *fakeQueue, p *fakePlace) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return p.n
}

// An owner that holds the lock re-enters it with AcquireWait at once,
// though waiters of other processes are ahead: they wait for it.
func TestLockService_QueueLetsTheHolderReenter(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	clk := testclock.New(holdStart)
	q := newFakeQueue()
	q.setAhead(1)
	svc := newHoldService(t, memory.NewLockRepository(), clk, application.WithWakeups(q))
	held, err := svc.Acquire(ctx, "A", plan, time.Minute)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := svc.AcquireWait(ctx, "A", plan, application.AcquireOptions{Wait: true, TTL: time.Minute})
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's re-entry waited behind the waiters that wait for it")
	}
	again, err := svc.Get(ctx, plan)
	require.NoError(t, err)
	assert.Equal(t, held.Token, again.Token)
	p := <-q.joined
	assert.True(t, <-p.left)
}
