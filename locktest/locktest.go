package locktest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// NewRepository returns a new, empty store for one subtest of Run; it
// registers any cleanup (closing a database, removing a file) with t, and
// fails t if it cannot make the store. Run calls it for every subtest, and
// every call must return a store of its own, that shares no lock with any
// other.
type NewRepository func(t *testing.T) application.LockRepository

// Start is the instant the mock clock shows at the start of every subtest,
// and the "now" of the subtests that call the store directly. It has a
// non-zero sub-second part, so that a store that loses precision shows.
var Start = time.Date(2026, 11, 29, 12, 0, 0, 123456000, time.UTC)

var (
	plan1    = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-1"}
	plan2    = domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-2"}
	project1 = domain.ResourceRef{Type: domain.ResourceProject, ID: "plan-1"} // same id, other type
)

// fixture is one subtest's service, store and clock.
type fixture struct {
	Svc   *application.LockService
	Repo  application.LockRepository
	Clock *clock.Mock
	Ctx   context.Context
}

// mustFixture builds a service on a new store with the clock at Start.
func mustFixture(t *testing.T, newRepo NewRepository, opts ...application.Option) *fixture {
	t.Helper()
	repo := newRepo(t)
	mc := clock.NewMock()
	mc.Set(Start)
	svc, err := application.NewLockService(repo, mc, 0, opts...)
	require.NoError(t, err)
	return &fixture{Svc: svc, Repo: repo, Clock: mc, Ctx: context.Background()}
}

// MustAcquire acquires or fails the test.
func (f *fixture) MustAcquire(t *testing.T, owner string, ref domain.ResourceRef, ttl time.Duration) domain.Lock {
	t.Helper()
	l, err := f.Svc.Acquire(f.Ctx, owner, ref, ttl)
	require.NoError(t, err)
	progressed(t)
	return l
}

// shorterTTL is the TTL of a re-entry or renewal of a lock taken for an
// hour: a renewal shortens the lock, a re-entry never does.
const shorterTTL = 10 * time.Second

// CheckShortened checks that l, what a renewal (what) of held on plan1
// with shorterTTL returned, expires at now+shorterTTL, as stored, earlier
// than held did: Renew's rule is now+ttl, not the later of the two
// expiries (a re-entry's is the later). It moves the clock to that
// expiry.
func (f *fixture) CheckShortened(t *testing.T, held, l domain.Lock, what string) {
	t.Helper()
	assert.Equal(t, held.Token, l.Token, "a %s keeps the token", what)
	assert.Equal(t, f.Clock.Now().Add(shorterTTL), l.ExpiresAt, "a %s with a shorter TTL expires at now+ttl", what)
	got, err := f.Svc.Get(f.Ctx, plan1)
	require.NoError(t, err)
	assert.Equal(t, l, got, "the shorter expiry is stored")
	f.Clock.Add(shorterTTL)
	_, err = f.Svc.Acquire(f.Ctx, "B", plan1, 0)
	require.NoError(t, err, "the lock expired at now+ttl of the %s, not at its first expiry", what)
}

// All returns every stored lock, expired ones included.
func (f *fixture) All(t *testing.T) []domain.Lock {
	t.Helper()
	all, err := f.Svc.List(f.Ctx, application.ListOptions{IncludeExpired: true})
	require.NoError(t, err)
	return all
}

// Run checks the store that newRepo makes against the whole contract of
// application.LockRepository, and reports each promise it breaks as a
// failed subtest of t named for it (for example
// "Release/NonHolderNeverRemoves"). The subtests are listed in the package
// documentation. Call it from a test function of the store's package:
//
//	func TestStore(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) application.LockRepository { return mystore.New() })
//	}
func Run(t *testing.T, newRepo NewRepository) {
	run(t, "Acquire", func(t *testing.T) { testAcquire(t, newRepo) })
	run(t, "Renew", func(t *testing.T) { testRenew(t, newRepo) })
	run(t, "Release", func(t *testing.T) { testRelease(t, newRepo) })
	run(t, "ReleaseAllForOwner", func(t *testing.T) { testReleaseAll(t, newRepo) })
	run(t, "CleanupExpired", func(t *testing.T) { testCleanup(t, newRepo) })
	run(t, "StaleCount", func(t *testing.T) { testStaleCount(t, newRepo) })
	run(t, "GetAndList", func(t *testing.T) { testGetAndList(t, newRepo) })
	run(t, "FencingToken", func(t *testing.T) { testFencingToken(t, newRepo) })
	run(t, "Validation", func(t *testing.T) { testValidation(t, newRepo) })
	run(t, "Concurrency", func(t *testing.T) { testConcurrency(t, newRepo) })
	run(t, "Repository", func(t *testing.T) { testRepository(t, newRepo) })
	run(t, "OneStatement", func(t *testing.T) { testOneStatement(t, newRepo) })
	run(t, "DeadHolder", func(t *testing.T) { testDeadHolder(t, newRepo) })
	run(t, "Handles", func(t *testing.T) { testHandles(t, newRepo) })
	run(t, "ExactBytes", func(t *testing.T) { testExactBytes(t, newRepo) })
	run(t, "EndedContext", func(t *testing.T) { testEndedContext(t, newRepo) })
	run(t, "Note", func(t *testing.T) { testNote(t, newRepo) })
}

func testAcquire(t *testing.T, newRepo NewRepository) {
	run(t, "FreeResource", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		l := f.MustAcquire(t, "A", plan1, 30*time.Second)
		assert.Positive(t, l.Token)
		assert.Equal(t, "A", l.Owner)
		assert.Equal(t, plan1, l.Resource)
		assert.Equal(t, Start, l.AcquiredAt)
		assert.Equal(t, Start.Add(30*time.Second), l.ExpiresAt)
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, l, got, "the stored lock is the returned one")
	})
	run(t, "ZeroTTLMeansDefault", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		l := f.MustAcquire(t, "A", plan1, 0)
		assert.Equal(t, Start.Add(domain.DefaultLockTTL), l.ExpiresAt)
	})
	run(t, "BoundsAccepted", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		assert.Equal(t, Start.Add(domain.MinLockTTL), f.MustAcquire(t, "A", plan1, domain.MinLockTTL).ExpiresAt)
		assert.Equal(t, Start.Add(domain.MaxLockTTL), f.MustAcquire(t, "A", plan2, domain.MaxLockTTL).ExpiresAt)
	})
	run(t, "ReentrantExtendsTTL", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		first := f.MustAcquire(t, "A", plan1, 10*time.Second)
		f.Clock.Add(9*time.Second + 999*time.Millisecond)
		again := f.MustAcquire(t, "A", plan1, 60*time.Second)
		assert.Equal(t, first.Token, again.Token, "re-entry keeps the token")
		assert.Equal(t, first.AcquiredAt, again.AcquiredAt, "re-entry keeps the acquisition time")
		assert.Equal(t, f.Clock.Now().Add(60*time.Second), again.ExpiresAt)
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, again, got)
	})
	run(t, "ReentryWithShorterTTLKeepsTheLaterExpiry", func(t *testing.T) {
		// Re-entry extends, never shortens: the expiry is the later of the
		// current one and now+ttl. A shorter one would end the lock behind
		// the back of whoever keeps it alive at its own TTL (agents locks
		// run, re-entered by agents locks acquire of the same owner).
		f := mustFixture(t, newRepo)
		first := f.MustAcquire(t, "A", plan1, time.Hour)
		f.Clock.Add(time.Second)
		again := f.MustAcquire(t, "A", plan1, shorterTTL)
		assert.Equal(t, first, again, "a re-entry with a shorter TTL keeps the token, the acquisition time and the later expiry")
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, first, got, "the later expiry is stored")
		f.Clock.Add(shorterTTL)
		_, err = f.Svc.Acquire(f.Ctx, "B", plan1, 0)
		require.ErrorIs(t, err, domain.ErrConflict, "the lock is held until its first expiry, not now+ttl of the re-entry")
	})
	run(t, "ConflictNamesHolder", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		held := f.MustAcquire(t, "A", plan1, 30*time.Second)
		f.Clock.Add(10 * time.Second)
		_, err := f.Svc.Acquire(f.Ctx, "B", plan1, 0)
		require.ErrorIs(t, err, domain.ErrConflict)
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, held, ce.Holder)
		assert.Equal(t, 20*time.Second, ce.Holder.Remaining(ce.Now))
		assert.Contains(t, err.Error(), `"A"`)
		assert.Equal(t, []domain.Lock{held}, f.All(t), "a refused acquire writes nothing")
	})
	run(t, "OtherResourcesAreIndependent", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 0)
		f.MustAcquire(t, "B", plan2, 0)
		f.MustAcquire(t, "C", project1, 0)
		assert.Len(t, f.All(t), 3)
	})
	run(t, "ExpiryBoundary", func(t *testing.T) {
		// Active strictly before ExpiresAt, expired at and after it.
		for _, tc := range []struct {
			name     string
			advance  time.Duration
			conflict bool
		}{
			{"OneMicrosecondBefore", 30*time.Second - time.Microsecond, true},
			{"At", 30 * time.Second, false},
			{"OneMicrosecondAfter", 30*time.Second + time.Microsecond, false},
			{"LongAfter", 2 * time.Hour, false},
		} {
			run(t, tc.name, func(t *testing.T) {
				f := mustFixture(t, newRepo)
				held := f.MustAcquire(t, "A", plan1, 30*time.Second)
				f.Clock.Add(tc.advance)
				l, err := f.Svc.Acquire(f.Ctx, "B", plan1, 0)
				if tc.conflict {
					require.ErrorIs(t, err, domain.ErrConflict)
					return
				}
				require.NoError(t, err, "an expired lock is taken over transparently")
				assert.Equal(t, "B", l.Owner)
				assert.Greater(t, l.Token, held.Token, "a takeover gets a new, larger token")
				assert.Equal(t, f.Clock.Now(), l.AcquiredAt)
				assert.Equal(t, []domain.Lock{l}, f.All(t), "the expired lock is replaced")
			})
		}
	})
	run(t, "SubSecondTTLDifference", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 5*time.Second)
		f.MustAcquire(t, "A", plan2, 5*time.Second+500*time.Millisecond)
		f.Clock.Add(5*time.Second + 250*time.Millisecond)
		_, err := f.Svc.Acquire(f.Ctx, "B", plan1, 0)
		require.NoError(t, err, "plan-1 expired 250ms ago")
		_, err = f.Svc.Acquire(f.Ctx, "B", plan2, 0)
		require.ErrorIs(t, err, domain.ErrConflict, "plan-2 still has 250ms left")
	})
	run(t, "SameOwnerAfterExpiryIsNewAcquisition", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		first := f.MustAcquire(t, "A", plan1, 5*time.Second)
		f.Clock.Add(5 * time.Second)
		again := f.MustAcquire(t, "A", plan1, 5*time.Second)
		assert.Greater(t, again.Token, first.Token, "the owner held nothing in between")
		assert.Equal(t, f.Clock.Now(), again.AcquiredAt)
	})
}

func testRenew(t *testing.T, newRepo NewRepository) {
	run(t, "HolderExtends", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		held := f.MustAcquire(t, "A", plan1, 10*time.Second)
		f.Clock.Add(5 * time.Second)
		l, err := f.Svc.Renew(f.Ctx, "A", plan1, 20*time.Second)
		require.NoError(t, err)
		assert.Equal(t, held.Token, l.Token)
		assert.Equal(t, held.AcquiredAt, l.AcquiredAt)
		assert.Equal(t, f.Clock.Now().Add(20*time.Second), l.ExpiresAt)
		f.Clock.Add(19 * time.Second)
		_, err = f.Svc.Acquire(f.Ctx, "B", plan1, 0)
		require.ErrorIs(t, err, domain.ErrConflict, "the renewed lock outlives its first TTL")
	})
	run(t, "ShorterTTLShortens", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		held := f.MustAcquire(t, "A", plan1, time.Hour)
		f.Clock.Add(time.Second)
		l, err := f.Svc.Renew(f.Ctx, "A", plan1, shorterTTL)
		require.NoError(t, err)
		f.CheckShortened(t, held, l, "renewal")
	})
	run(t, "ZeroTTLMeansDefault", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 10*time.Second)
		l, err := f.Svc.Renew(f.Ctx, "A", plan1, 0)
		require.NoError(t, err)
		assert.Equal(t, Start.Add(domain.DefaultLockTTL), l.ExpiresAt)
	})
	run(t, "ExpiryBoundary", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			advance time.Duration
			expired bool
		}{
			{"OneMicrosecondBefore", 10*time.Second - time.Microsecond, false},
			{"At", 10 * time.Second, true},
			{"HalfSecondAfter", 10*time.Second + 500*time.Millisecond, true},
		} {
			run(t, tc.name, func(t *testing.T) {
				f := mustFixture(t, newRepo)
				held := f.MustAcquire(t, "A", plan1, 10*time.Second)
				f.Clock.Add(tc.advance)
				_, err := f.Svc.Renew(f.Ctx, "A", plan1, 0)
				if !tc.expired {
					require.NoError(t, err)
					return
				}
				require.ErrorIs(t, err, domain.ErrExpired)
				var ee *domain.LockExpiredError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, held.ExpiresAt, ee.ExpiredAt)
				assert.Equal(t, []domain.Lock{held}, f.All(t), "a refused renew writes nothing")
			})
		}
	})
	run(t, "MissingLockIsExpired", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		_, err := f.Svc.Renew(f.Ctx, "A", plan1, 0)
		require.ErrorIs(t, err, domain.ErrExpired)
		var ee *domain.LockExpiredError
		require.ErrorAs(t, err, &ee)
		assert.True(t, ee.ExpiredAt.IsZero())
		assert.Empty(t, f.All(t))
	})
	run(t, "ReleasedLockIsExpired", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 0)
		_, err := f.Svc.Release(f.Ctx, "A", plan1)
		require.NoError(t, err)
		_, err = f.Svc.Renew(f.Ctx, "A", plan1, 0)
		require.ErrorIs(t, err, domain.ErrExpired)
	})
	run(t, "OtherOwnersActiveLockConflicts", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		held := f.MustAcquire(t, "A", plan1, 0)
		_, err := f.Svc.Renew(f.Ctx, "B", plan1, 0)
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, held, ce.Holder)
	})
	run(t, "OtherOwnersExpiredLockIsExpired", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		held := f.MustAcquire(t, "A", plan1, 5*time.Second)
		f.Clock.Add(6 * time.Second)
		_, err := f.Svc.Renew(f.Ctx, "B", plan1, 0)
		require.ErrorIs(t, err, domain.ErrExpired)
		assert.Equal(t, []domain.Lock{held}, f.All(t))
	})
	run(t, "FormerHolderAfterTakeoverConflicts", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 5*time.Second)
		f.Clock.Add(5 * time.Second)
		taken := f.MustAcquire(t, "B", plan1, 0)
		_, err := f.Svc.Renew(f.Ctx, "A", plan1, 0)
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, taken, ce.Holder)
	})
}

func testRelease(t *testing.T, newRepo NewRepository) {
	run(t, "HolderReleases", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 0)
		ok, err := f.Svc.Release(f.Ctx, "A", plan1)
		require.NoError(t, err)
		assert.True(t, ok)
		_, err = f.Svc.Get(f.Ctx, plan1)
		require.ErrorIs(t, err, domain.ErrNotFound)
		f.MustAcquire(t, "B", plan1, 0)
	})
	run(t, "NonHolderNeverRemoves", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		held := f.MustAcquire(t, "A", plan1, 5*time.Second)
		ok, err := f.Svc.Release(f.Ctx, "B", plan1)
		require.NoError(t, err)
		assert.False(t, ok)
		f.Clock.Add(time.Hour)
		ok, err = f.Svc.Release(f.Ctx, "B", plan1)
		require.NoError(t, err)
		assert.False(t, ok, "not even once it has expired")
		assert.Equal(t, []domain.Lock{held}, f.All(t))
	})
	run(t, "NotHeldIsNoError", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		ok, err := f.Svc.Release(f.Ctx, "A", plan1)
		require.NoError(t, err)
		assert.False(t, ok)
	})
	run(t, "OwnExpiredLock", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 5*time.Second)
		f.Clock.Add(time.Minute)
		ok, err := f.Svc.Release(f.Ctx, "A", plan1)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, f.All(t))
	})
	run(t, "OnlyThatResource", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 0)
		other := f.MustAcquire(t, "A", project1, 0)
		_, err := f.Svc.Release(f.Ctx, "A", plan1)
		require.NoError(t, err)
		assert.Equal(t, []domain.Lock{other}, f.All(t))
	})
}

func testReleaseAll(t *testing.T, newRepo NewRepository) {
	f := mustFixture(t, newRepo)
	f.MustAcquire(t, "A", plan1, 0)
	f.MustAcquire(t, "A", project1, 5*time.Second)
	kept := f.MustAcquire(t, "B", plan2, 0)
	f.Clock.Add(10 * time.Second)
	n, err := f.Svc.ReleaseAllForOwner(f.Ctx, "A")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "active and expired locks of the owner")
	assert.Equal(t, []domain.Lock{kept}, f.All(t))
	n, err = f.Svc.ReleaseAllForOwner(f.Ctx, "A")
	require.NoError(t, err)
	assert.Zero(t, n)
}

func testCleanup(t *testing.T, newRepo NewRepository) {
	run(t, "Boundary", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		f.MustAcquire(t, "A", plan1, 5*time.Second)
		f.MustAcquire(t, "A", plan2, 5*time.Second+time.Microsecond)
		keep := f.MustAcquire(t, "B", project1, 10*time.Second)
		f.Clock.Add(5*time.Second - time.Microsecond)
		n, err := f.Svc.CleanupExpired(f.Ctx)
		require.NoError(t, err)
		assert.Zero(t, n, "nothing has expired yet")
		f.Clock.Add(time.Microsecond)
		n, err = f.Svc.CleanupExpired(f.Ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "plan-1 expires exactly now")
		f.Clock.Add(time.Microsecond)
		n, err = f.Svc.CleanupExpired(f.Ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, []domain.Lock{keep}, f.All(t))
	})
	run(t, "ManyBatches", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		const expired = 2345
		for i := range expired {
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i)}
			f.MustAcquire(t, "A", ref, 5*time.Second)
		}
		keep := f.MustAcquire(t, "A", plan1, time.Minute)
		f.Clock.Add(30 * time.Second)
		n, err := f.Svc.CleanupExpired(f.Ctx)
		require.NoError(t, err)
		assert.Equal(t, expired, n)
		assert.Equal(t, []domain.Lock{keep}, f.All(t))
	})
}

func testStaleCount(t *testing.T, newRepo NewRepository) {
	f := mustFixture(t, newRepo)
	f.MustAcquire(t, "A", plan1, 5*time.Second)
	f.MustAcquire(t, "B", plan2, 5*time.Second+500*time.Millisecond)
	count := func() int {
		n, err := f.Svc.StaleCount(f.Ctx)
		require.NoError(t, err)
		return n
	}
	assert.Zero(t, count())
	f.Clock.Add(5*time.Second - time.Microsecond)
	assert.Zero(t, count(), "before expiry")
	f.Clock.Add(time.Microsecond)
	assert.Equal(t, 1, count(), "at expiry")
	f.Clock.Add(500 * time.Millisecond)
	assert.Equal(t, 2, count(), "after both")
	n, err := f.Svc.CleanupExpired(f.Ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "cleanup purges what the count reported")
	assert.Zero(t, count())
}

func testGetAndList(t *testing.T, newRepo NewRepository) {
	f := mustFixture(t, newRepo)
	_, err := f.Svc.Get(f.Ctx, plan1)
	require.ErrorIs(t, err, domain.ErrNotFound)

	p2 := f.MustAcquire(t, "B", plan2, time.Minute)
	p1 := f.MustAcquire(t, "A", plan1, 5*time.Second)
	pr := f.MustAcquire(t, "A", project1, time.Minute)
	f.Clock.Add(5 * time.Second)

	got, err := f.Svc.Get(f.Ctx, plan1)
	require.NoError(t, err)
	assert.Equal(t, p1, got, "Get returns an expired lock too")
	assert.True(t, got.ExpiredAt(f.Svc.Now()))

	list := func(o application.ListOptions) []domain.Lock {
		l, err := f.Svc.List(f.Ctx, o)
		require.NoError(t, err)
		return l
	}
	assert.Equal(t, []domain.Lock{p2, pr}, list(application.ListOptions{}), "active only, by type then id")
	assert.Equal(t, []domain.Lock{p1, p2, pr}, list(application.ListOptions{IncludeExpired: true}))
	assert.Equal(t, []domain.Lock{p2}, list(application.ListOptions{Type: domain.ResourcePlan}))
	assert.Equal(t, []domain.Lock{pr}, list(application.ListOptions{Owner: "A"}))
	assert.Equal(t, []domain.Lock{p1}, list(application.ListOptions{Owner: "A", Type: domain.ResourcePlan, IncludeExpired: true}))
	assert.Empty(t, list(application.ListOptions{Owner: "nobody"}))
}

func testFencingToken(t *testing.T, newRepo NewRepository) {
	f := mustFixture(t, newRepo)
	var last int64
	next := func(l domain.Lock) {
		t.Helper()
		assert.Greater(t, l.Token, last)
		last = l.Token
	}
	next(f.MustAcquire(t, "A", plan1, 5*time.Second))
	same := f.MustAcquire(t, "A", plan1, 5*time.Second)
	assert.Equal(t, last, same.Token, "re-entry keeps it")
	renewed, err := f.Svc.Renew(f.Ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, last, renewed.Token, "renew keeps it")

	_, err = f.Svc.Release(f.Ctx, "A", plan1)
	require.NoError(t, err)
	next(f.MustAcquire(t, "B", plan1, 5*time.Second)) // after release

	f.Clock.Add(5 * time.Second)
	next(f.MustAcquire(t, "A", plan1, 5*time.Second)) // takeover after expiry

	// Empty the store completely, by every route, then acquire again.
	_, err = f.Svc.ReleaseAllForOwner(f.Ctx, "A")
	require.NoError(t, err)
	f.MustAcquire(t, "C", plan2, 5*time.Second)
	f.Clock.Add(time.Minute)
	_, err = f.Svc.CleanupExpired(f.Ctx)
	require.NoError(t, err)
	require.Empty(t, f.All(t))
	l := f.MustAcquire(t, "A", plan1, 0)
	assert.Greater(t, l.Token, last, "tokens are never reused, even after the store empties")
}

func testValidation(t *testing.T, newRepo NewRepository) {
	long := strings.Repeat("x", domain.MaxIdentifierBytes+1)
	for _, tc := range []struct {
		name  string
		owner string
		ref   domain.ResourceRef
		ttl   time.Duration
		field string
	}{
		{"EmptyOwner", "", plan1, 0, "owner_id"},
		{"BlankOwner", " \t\n", plan1, 0, "owner_id"},
		{"LongOwner", long, plan1, 0, "owner_id"},
		{"InvalidUTF8Owner", "a\xffb", plan1, 0, "owner_id"},
		{"NULInOwner", "a\x00b", plan1, 0, "owner_id"},
		{"UnknownType", "A", domain.ResourceRef{Type: "task", ID: "x"}, 0, "resource_type"},
		{"EmptyType", "A", domain.ResourceRef{ID: "x"}, 0, "resource_type"},
		{"TypeWrongCase", "A", domain.ResourceRef{Type: "Plan", ID: "x"}, 0, "resource_type"},
		{"EmptyID", "A", domain.ResourceRef{Type: domain.ResourcePlan}, 0, "resource_id"},
		{"LongID", "A", domain.ResourceRef{Type: domain.ResourcePlan, ID: long}, 0, "resource_id"},
		{"TTLBelowMin", "A", plan1, domain.MinLockTTL - time.Nanosecond, "ttl"},
		{"TTLAboveMax", "A", plan1, domain.MaxLockTTL + time.Nanosecond, "ttl"},
		{"NegativeTTL", "A", plan1, -time.Second, "ttl"},
	} {
		run(t, tc.name, func(t *testing.T) {
			f := mustFixture(t, newRepo)
			earlier := f.MustAcquire(t, "A", plan2, 0)
			check := func(err error) {
				t.Helper()
				require.ErrorIs(t, err, domain.ErrValidation)
				var ve *domain.ValidationError
				require.ErrorAs(t, err, &ve)
				assert.Equal(t, tc.field, ve.Field)
			}
			_, err := f.Svc.Acquire(f.Ctx, tc.owner, tc.ref, tc.ttl)
			check(err)
			_, err = f.Svc.Renew(f.Ctx, tc.owner, tc.ref, tc.ttl)
			check(err)
			if tc.field != "ttl" {
				_, err = f.Svc.Release(f.Ctx, tc.owner, tc.ref)
				check(err)
			}
			assert.Equal(t, []domain.Lock{earlier}, f.All(t), "nothing is written")
			l := f.MustAcquire(t, "A", plan1, 0)
			assert.Greater(t, l.Token, earlier.Token, "the next token is still greater than every earlier one")
		})
	}
	run(t, "LongestValidIDs", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		max := strings.Repeat("é", domain.MaxIdentifierBytes/2) // 254 bytes of 2-byte runes
		ref := domain.ResourceRef{Type: domain.ResourceProject, ID: max + "x"}
		l := f.MustAcquire(t, max+"y", ref, 0)
		got, err := f.Svc.Get(f.Ctx, ref)
		require.NoError(t, err)
		assert.Equal(t, l, got, "255-byte ids round-trip unchanged")
	})
	run(t, "ReleaseAllBadOwner", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		_, err := f.Svc.ReleaseAllForOwner(f.Ctx, "")
		require.ErrorIs(t, err, domain.ErrValidation)
	})
}

func testConcurrency(t *testing.T, newRepo NewRepository) {
	run(t, "ExactlyOneWinner", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		const racers = 16
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []string
			start   = make(chan struct{})
		)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := "owner-" + itoa(i)
				<-start
				_, err := f.Svc.Acquire(f.Ctx, owner, plan1, 0)
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, owner)
					mu.Unlock()
				case !errors.Is(err, domain.ErrConflict):
					t.Errorf("%s: unexpected error: %v", owner, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Len(t, winners, 1, "exactly one owner wins")
		got, err := f.Svc.Get(f.Ctx, plan1)
		require.NoError(t, err)
		assert.Equal(t, winners[0], got.Owner)
	})
	run(t, "HandoffsNeverOverlap", func(t *testing.T) {
		f := mustFixture(t, newRepo)
		const workers, rounds = 8, 25
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			inside atomic.Int32
			tokens []int64
		)
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := "w" + itoa(i)
				for done := 0; done < rounds; {
					l, err := f.Svc.Acquire(f.Ctx, owner, plan1, 0)
					if errors.Is(err, domain.ErrConflict) {
						continue
					}
					if !assert.NoError(t, err) {
						return
					}
					// The witness: a counter that only the holder may move.
					if n := inside.Add(1); n != 1 {
						t.Errorf("%s entered while %d others were inside", owner, n-1)
					}
					mu.Lock()
					tokens = append(tokens, l.Token)
					mu.Unlock()
					runtime.Gosched() // give an intruder the chance to show
					inside.Add(-1)
					ok, err := f.Svc.Release(f.Ctx, owner, plan1)
					if !assert.NoError(t, err) || !assert.True(t, ok) {
						return
					}
					done++
				}
			}()
		}
		wg.Wait()
		require.Len(t, tokens, workers*rounds)
		for i := 1; i < len(tokens); i++ {
			require.Greater(t, tokens[i], tokens[i-1], "tokens increase in the order of entry: "+
				"a holder with a smaller token than its predecessor's is refused by every fence the predecessor passed, "+
				"and the predecessor's late writes pass (a token drawn before the write that orders the holders?)")
		}
	})
	run(t, "ReadsDuringWrites", func(t *testing.T) { testReadsDuringWrites(t, newRepo) })
	run(t, "TokensNeverRepeatAcrossResources", func(t *testing.T) { testTokensAcrossResources(t, newRepo) })
}

// testReadsDuringWrites runs Get, List and CountExpired while owners
// acquire and release other resources: a store that reads without the
// lock its writes take shows under -race (or crashes on a concurrent map
// access, in this function). The reads go to the store itself, so that
// nothing in the service orders them after the writes.
func testReadsDuringWrites(t *testing.T, newRepo NewRepository) {
	f := mustFixture(t, newRepo)
	// The writers write rounds times, and on (up to 20 times as long)
	// until the readers have read minReads times between them: a loaded
	// machine may not run a reader while the writers write.
	const writers, rounds, readers, minReads = 4, 25, 2, 100
	var reads atomic.Int64
	ref := func(i int) domain.ResourceRef {
		return domain.ResourceRef{Type: domain.ResourcePlan, ID: "w" + itoa(i)}
	}
	stop := make(chan struct{})
	var wg, rg, reading sync.WaitGroup
	reading.Add(readers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reading.Wait() // the writes start once every reader reads
			for n := 0; n < rounds || (reads.Load() < minReads && n < 20*rounds); n++ {
				_, err := f.Svc.Acquire(f.Ctx, "w"+itoa(i), ref(i), time.Minute)
				if !assert.NoError(t, err) {
					return
				}
				ok, err := f.Svc.Release(f.Ctx, "w"+itoa(i), ref(i))
				if !assert.NoError(t, err) || !assert.True(t, ok) {
					return
				}
			}
		}()
	}
	for r := range readers {
		rg.Add(1)
		go func() {
			defer rg.Done()
			var once sync.Once
			ready := func() { once.Do(reading.Done) }
			defer ready() // a reader that stops early holds no writer back
			for n := r; ; n++ {
				if n > r {
					ready() // this reader has read once
				}
				select {
				case <-stop:
					return
				default:
				}
				l, err := f.Repo.Get(f.Ctx, ref(n%writers))
				if err == nil {
					assert.Equal(t, "w"+itoa(n%writers), l.Owner, "Get during writes returns a lock as stored")
				} else if !assert.ErrorIs(t, err, domain.ErrNotFound) {
					return
				}
				all, err := f.Repo.List(f.Ctx, application.ListFilter{})
				if !assert.NoError(t, err) {
					return
				}
				for _, l := range all {
					assert.Equal(t, l.Resource.ID, l.Owner, "List during writes returns locks as stored")
				}
				expired, err := f.Repo.CountExpired(f.Ctx, Start)
				if !assert.NoError(t, err) || !assert.Zero(t, expired) {
					return
				}
				reads.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	rg.Wait()
}

// testTokensAcrossResources has many resources change hands at once: a
// store whose token counter is not shared by all its writers (a lock per
// resource, and an unsynchronised counter) hands one token out twice, or
// a smaller one after a larger; -race also reports the counter. Each
// Decide yields, so that the writes of the resources overlap even on a
// loaded machine.
func testTokensAcrossResources(t *testing.T, newRepo NewRepository) {
	repo := newRepo(t)
	const resources, rounds = 8, 40
	tokens := make([][]int64, resources) // one slice per goroutine: nothing shared
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range resources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := domain.ResourceRef{Type: domain.ResourceProject, ID: "r" + itoa(i)}
			<-start
			for range rounds {
				// A new lock each round: the resource changes hands.
				l, err := repo.Update(t.Context(), ref, func(*domain.Lock) (application.Change, error) {
					runtime.Gosched() // let the others decide meanwhile
					return application.Change{Kind: application.ChangeInsert, Lock: domain.Lock{
						Owner: "A", AcquiredAt: Start, ExpiresAt: Start.Add(time.Minute)}}, nil
				})
				if !assert.NoError(t, err) {
					return
				}
				tokens[i] = append(tokens[i], l.Token)
			}
		}()
	}
	close(start)
	wg.Wait()
	seen := make(map[int64]int, resources*rounds)
	var twice []string
	for i, ts := range tokens {
		require.Len(t, ts, rounds)
		for j, tok := range ts {
			if j > 0 && tok <= ts[j-1] {
				t.Errorf("resource r%d was handed token %d after token %d: tokens grow", i, tok, ts[j-1])
			}
			if other, dup := seen[tok]; dup {
				twice = append(twice, fmt.Sprintf("%d (r%d and r%d)", tok, other, i))
			}
			seen[tok] = i
		}
	}
	if len(twice) > 0 {
		t.Errorf("%d of %d tokens were handed out twice, on different resources: tokens never repeat across the store; "+
			"the first: %s", len(twice), resources*rounds, strings.Join(twice[:min(len(twice), 5)], ", "))
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
