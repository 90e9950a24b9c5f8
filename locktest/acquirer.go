package locktest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// undecidedMargin is how close to its expiry an owner's own lock may be
// for a store to leave its re-entry to Update (application.ErrUndecided):
// a store that checks activity at the time of its write, later than now,
// may find it expired by then. Every other case must be decided.
const undecidedMargin = time.Second

// A store that decides every case but a re-entry near its lock's expiry
// says so with a DecidesAll method; the contract then holds it to that.

// testAcquirer holds a store that acquires by itself (application.Acquirer)
// to the Go rule, application.DecideAcquire: every state a resource can be
// in, around each expiry boundary, goes through AcquireAt, and the outcome,
// the lock returned and the store afterwards must be what the rule says.
func testAcquirer(t *testing.T, newRepo NewRepository) {
	if _, ok := newRepo(t).(application.Acquirer); !ok {
		t.Skip("the store does not acquire by itself")
	}
	for _, tc := range resourceStates() {
		run(t, tc.name, func(t *testing.T) {
			repo := newRepo(t)
			cur := mustStore(t, repo, tc.cur)
			now, expires := Start, Start.Add(stateTTL)
			want, wantErr := application.DecideAcquire(cur, "A", plan1, now, expires)
			got, err := repo.(application.Acquirer).AcquireAt(t.Context(), plan1, "A", func() (time.Time, time.Time) { return now, expires })
			checkAcquisition(t, repo, cur, want, wantErr, got, err, now)
		})
	}
}

// stateTTL is the TTL of the calls that resourceStates are put through.
const stateTTL = 30 * time.Second

// resourceState is a state a resource can be in before a call at Start by
// owner "A": cur is the lock stored on plan1, nil when there is none.
type resourceState struct {
	name string
	cur  *domain.Lock
}

// resourceStates are the states around each expiry boundary, of the
// caller's own lock and of another owner's.
func resourceStates() []resourceState {
	stored := func(owner string, expiresIn time.Duration) *domain.Lock {
		return &domain.Lock{Owner: owner, Resource: plan1, AcquiredAt: Start.Add(expiresIn - time.Minute), ExpiresAt: Start.Add(expiresIn)}
	}
	return []resourceState{
		{"Free", nil},
		{"OwnActive", stored("A", 10*time.Second)},
		// Later than now+stateTTL: a re-entry keeps the later expiry.
		{"OwnActiveLaterThanTheTTL", stored("A", time.Hour)},
		{"OwnActiveLastMicrosecond", stored("A", time.Microsecond)},
		{"OwnExpiresNow", stored("A", 0)},
		{"OwnExpired", stored("A", -time.Hour)},
		{"OtherActive", stored("B", 10*time.Second)},
		{"OtherActiveLastMicrosecond", stored("B", time.Microsecond)},
		{"OtherExpiresNow", stored("B", 0)},
		{"OtherExpired", stored("B", -time.Hour)},
	}
}

// mustStore stores cur on plan1 through Update and returns it as stored
// (with its token), or returns nil for no lock.
func mustStore(t *testing.T, repo application.LockRepository, cur *domain.Lock) *domain.Lock {
	t.Helper()
	if cur == nil {
		return nil
	}
	l, err := repo.Update(t.Context(), plan1, func(*domain.Lock) (application.Change, error) {
		return application.Change{Kind: application.ChangeInsert, Lock: *cur}, nil
	})
	require.NoError(t, err)
	return &l
}

// checkAcquisition compares what AcquireAt did (got, err) with what the
// rule says (want, wantErr) on cur, and the store afterwards.
func checkAcquisition(t *testing.T, repo application.LockRepository, cur *domain.Lock, want application.Change, wantErr error,
	got application.Acquisition, err error, now time.Time) {
	t.Helper()
	_, decidesAll := repo.(interface{ DecidesAll() })
	after, gerr := repo.Get(t.Context(), plan1)
	if errors.Is(gerr, domain.ErrNotFound) {
		gerr = nil
	}
	require.NoError(t, gerr)
	unchanged := func() {
		t.Helper()
		if cur == nil {
			assert.Zero(t, after, "nothing was written")
		} else {
			assert.Equal(t, *cur, after, "nothing was written")
		}
	}
	switch {
	case errors.Is(err, application.ErrUndecided) && !decidesAll:
		// A store may decide only some cases (SQLite's, a free resource):
		// the others go to Update, untouched.
		unchanged()
	case errors.Is(err, application.ErrUndecided):
		require.Equal(t, application.ChangeExtend, want.Kind, "only a re-entry may be left to Update, the rule says %v, %v", want, wantErr)
		assert.Less(t, cur.ExpiresAt.Sub(now), undecidedMargin, "a re-entry well before the expiry is decided")
		unchanged()
	case wantErr != nil:
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce, "the rule refuses: %v", wantErr)
		assert.Equal(t, wantErr, err, "the refusal names the holder as stored, at now")
		unchanged()
	case want.Kind == application.ChangeExtend:
		require.NoError(t, err)
		assert.True(t, got.Reentered, "a re-entry")
		assert.Nil(t, got.Previous)
		l := *cur
		l.ExpiresAt = want.Lock.ExpiresAt
		assert.Equal(t, l, got.Lock, "the token and the acquisition time stay, the expiry moves")
		assert.Equal(t, l, after)
		assert.False(t, after.ExpiresAt.Before(cur.ExpiresAt), "a re-entry never shortens the lock: it expired at %s, now at %s",
			cur.ExpiresAt, after.ExpiresAt)
	default: // ChangeInsert
		require.NoError(t, err)
		assert.False(t, got.Reentered)
		assert.Equal(t, cur, got.Previous, "a takeover names the lock it replaced")
		l := want.Lock
		l.Token = got.Lock.Token
		assert.Equal(t, l, got.Lock)
		if cur != nil {
			assert.Greater(t, got.Lock.Token, cur.Token, "a change of hands gets a new, larger token")
		}
		assert.Equal(t, got.Lock, after)
	}
}

// testTaker holds a store that takes a handle's lock by itself
// (application.Taker) to Take's rule, application.DecideTake, in every
// state of resourceStates: above all, it never re-enters the caller's own
// active lock (a Take refuses it, SameOwner). A store that decides every
// case (DecidesAll) leaves none of them to Update, since Take's rule has
// no re-entry to check at the time of the write.
func testTaker(t *testing.T, newRepo NewRepository) {
	if _, ok := newRepo(t).(application.Taker); !ok {
		t.Skip("the store does not take by itself")
	}
	for _, tc := range resourceStates() {
		run(t, tc.name, func(t *testing.T) {
			repo := newRepo(t)
			cur := mustStore(t, repo, tc.cur)
			now, expires := Start, Start.Add(stateTTL)
			want, wantErr := application.DecideTake(cur, "A", plan1, now, expires)
			require.NotEqual(t, application.ChangeExtend, want.Kind, "Take's rule never re-enters")
			got, err := repo.(application.Taker).TakeAt(t.Context(), plan1, "A", func() (time.Time, time.Time) { return now, expires })
			assert.False(t, got.Reentered, "a Take never re-enters")
			checkAcquisition(t, repo, cur, want, wantErr, got, err, now)
		})
	}
}
