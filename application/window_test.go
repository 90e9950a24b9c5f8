package application_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// stallingRepo is the memory store with an Update that stops before the
// real one, as a store does that queues behind another writer, until the
// test lets it go; after, when set, runs once the real Update returned, as
// a slow commit would.
type stallingRepo struct {
	*memory.LockRepository
	entered chan struct{}
	proceed chan struct{}
	after   func()
}

func newStallingRepo() *stallingRepo {
	return &stallingRepo{LockRepository: memory.NewLockRepository(),
		entered: make(chan struct{}, 1), proceed: make(chan struct{})}
}

func (r *stallingRepo) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	r.entered <- struct{}{}
	<-r.proceed
	l, err := r.LockRepository.Update(ctx, ref, decide)
	if r.after != nil {
		r.after()
	}
	return l, err
}

func TestLockService_TimeOfTheWrite(t *testing.T) {
	start := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	ctx := context.Background()
	for _, op := range []string{"Acquire", "Renew"} {
		t.Run(op+"DatedAfterWaitingForTheStore", func(t *testing.T) {
			repo := newStallingRepo()
			mc := clock.NewMock()
			mc.Set(start)
			svc, err := application.NewLockService(repo, mc, 0)
			require.NoError(t, err)
			if op == "Renew" {
				close(repo.proceed)
				_, err := svc.Acquire(ctx, "A", plan, 5*time.Second)
				require.NoError(t, err)
				<-repo.entered
				repo.proceed = make(chan struct{})
			}

			type result struct {
				l   domain.Lock
				err error
			}
			done := make(chan result)
			go func() {
				var r result
				if op == "Acquire" {
					r.l, r.err = svc.Acquire(ctx, "A", plan, 5*time.Second)
				} else {
					r.l, r.err = svc.Renew(ctx, "A", plan, 5*time.Second)
				}
				done <- r
			}()
			<-repo.entered
			// The store keeps the call waiting for 4 s: longer than what
			// was left of the lock being renewed, most of the new TTL.
			mc.Add(4 * time.Second)
			close(repo.proceed)
			r := <-done
			require.NoError(t, r.err)
			assert.Equal(t, start.Add(9*time.Second), r.l.ExpiresAt, "now+ttl, with now taken after the wait")
			assert.False(t, r.l.ExpiredAt(mc.Now()))
		})
	}

	t.Run("WriteSlowerThanTheTTLIsAnError", func(t *testing.T) {
		repo := newStallingRepo()
		close(repo.proceed)
		mc := clock.NewMock()
		mc.Set(start)
		svc, err := application.NewLockService(repo, mc, 0)
		require.NoError(t, err)
		repo.after = func() { mc.Add(6 * time.Second) } // the commit took 6 s
		go func() {
			for range repo.entered {
			}
		}()
		defer close(repo.entered)

		_, err = svc.Acquire(ctx, "A", plan, 5*time.Second)
		var expired *domain.LockExpiredError
		require.ErrorAs(t, err, &expired)
		assert.Equal(t, start.Add(5*time.Second), expired.ExpiredAt)
		assert.Equal(t, start.Add(6*time.Second), expired.WrittenAt)
		assert.Contains(t, expired.Error(), "too slow for the TTL")
	})
}

func TestLockService_Close(t *testing.T) {
	ctx := context.Background()
	t.Run("WaitsForCallsInFlight", func(t *testing.T) {
		repo := newStallingRepo()
		svc, err := application.NewLockService(repo, clock.NewMock(), 0)
		require.NoError(t, err)
		acquired := make(chan error)
		go func() { _, err := svc.Acquire(ctx, "A", plan, 0); acquired <- err }()
		<-repo.entered

		closed := make(chan error)
		go func() { closed <- svc.Close(ctx) }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while an acquire was still writing", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(repo.proceed)
		require.NoError(t, <-acquired, "a call admitted before Close completes")
		require.NoError(t, <-closed)
		_, err = repo.LockRepository.Get(ctx, plan)
		require.NoError(t, err, "and its write is in the store when Close returns")
	})

	t.Run("RefusesLaterCalls", func(t *testing.T) {
		repo := &failingRepo{}
		svc, err := application.NewLockService(repo, clock.NewMock(), 0)
		require.NoError(t, err)
		require.NoError(t, svc.Close(ctx))
		require.NoError(t, svc.Close(ctx), "closing twice is harmless")
		for name, call := range map[string]func() error{
			"Acquire":    func() error { _, err := svc.Acquire(ctx, "A", plan, 0); return err },
			"Renew":      func() error { _, err := svc.Renew(ctx, "A", plan, 0); return err },
			"Release":    func() error { _, err := svc.Release(ctx, "A", plan); return err },
			"ReleaseAll": func() error { _, err := svc.ReleaseAllForOwner(ctx, "A"); return err },
			"Cleanup":    func() error { _, err := svc.CleanupExpired(ctx); return err },
			"StaleCount": func() error { _, err := svc.StaleCount(ctx); return err },
			"Get":        func() error { _, err := svc.Get(ctx, plan); return err },
			"List":       func() error { _, err := svc.List(ctx, application.ListOptions{}); return err },
		} {
			t.Run(name, func(t *testing.T) { require.ErrorIs(t, call(), domain.ErrClosed) })
		}
		assert.Zero(t, repo.calls, "nothing reaches the store after Close")
	})

	t.Run("GivesUpWhenTheContextEnds", func(t *testing.T) {
		repo := newStallingRepo()
		svc, err := application.NewLockService(repo, clock.NewMock(), 0)
		require.NoError(t, err)
		go func() { _, _ = svc.Acquire(ctx, "A", plan, 0) }()
		<-repo.entered
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		err = svc.Close(cctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.Contains(t, err.Error(), "1 calls were still in flight")
		close(repo.proceed)
	})
}

// A wait goes on after a try whose write took longer than the TTL (the
// lock it wrote had lapsed before the caller could use it): it takes the
// lock again, where it used to end with the LockExpiredError.
func TestLockService_WaitOutlastsASlowWrite(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	repo := newStallingRepo()
	close(repo.proceed)
	mc := clock.NewMock()
	mc.Set(start)
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	slow := true
	repo.after = func() {
		if slow {
			slow = false
			mc.Add(6 * time.Second) // the first write took 6 s
		}
	}
	go func() {
		for range repo.entered {
		}
	}()
	defer close(repo.entered)

	h, err := svc.Take(ctx, "A", plan, application.AcquireOptions{TTL: 5 * time.Second, Wait: true, Timeout: time.Minute})
	require.NoError(t, err)
	assert.False(t, h.Lock().ExpiredAt(mc.Now()), "the lock of the second try, active")
	assert.Equal(t, start.Add(6*time.Second), h.Lock().AcquiredAt)
}
