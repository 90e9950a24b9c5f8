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

// undecidedMargin is how close to its expiry a lock may be for a store to
// leave its extension (a re-entry, a renewal) to Update: a store that
// checks activity at the time of its write, later than now, may find it
// expired by then.
const undecidedMargin = time.Second

// A store that decides every case of Acquire and Take, and every
// extension, but one near its lock's expiry says so with a DecidesAll
// method; the contract then holds it to that.

// stateTTL is the TTL of the calls that resourceStates are put through.
const stateTTL = 30 * time.Second

// oneStatementRules are the rules a OneStatement store may carry out, with
// the state in which a store that carries one out must decide it.
var oneStatementRules = []struct {
	name  string
	kind  application.OpKind
	plain string
}{
	{"Acquire", application.OpAcquire, "Free"},
	{"Take", application.OpTake, "Free"},
	{"Renew", application.OpRenew, "OwnActive"},
	{"RenewToken", application.OpRenewToken, "OwnActive"},
}

// testOneStatement holds a store that decides in one statement
// (application.OneStatement) to the Go rule of every Op (Op.Decide):
// every state a resource can be in, around each expiry boundary, goes
// through Apply for each rule, and the outcome, the lock returned and the
// store afterwards must be what the rule says, or nothing written where
// the store leaves the decision to Update. A store that leaves a rule's
// plainest case to Update (and is not DecidesAll) does not carry out that
// rule: its subtests skip.
func testOneStatement(t *testing.T, newRepo NewRepository) {
	if _, ok := newRepo(t).(application.OneStatement); !ok {
		t.Skip("the store does not decide in one statement")
	}
	for _, r := range oneStatementRules {
		run(t, r.name, func(t *testing.T) {
			if _, all := newRepo(t).(interface{ DecidesAll() }); !all && !decides(t, newRepo, r.kind, r.plain) {
				t.Skipf("the store leaves %s to Update", r.name)
			}
			for _, tc := range resourceStates() {
				run(t, tc.name, func(t *testing.T) {
					repo := newRepo(t)
					cur := mustStore(t, repo, tc.cur)
					for _, op := range opsOn(r.kind, cur) {
						checkOp(t, repo, cur, op)
					}
				})
			}
		})
	}
}

// opsOn are the Ops of kind by owner "A" on plan1, stored as cur. A
// handle's renewal is tried for an acquisition that is not cur (another
// token), then for cur's own token as a handle of A would hold it,
// whatever cur's owner.
func opsOn(kind application.OpKind, cur *domain.Lock) []application.Op {
	op := application.Op{Kind: kind, Owner: "A", Ref: plan1}
	if kind != application.OpRenewToken {
		return []application.Op{op}
	}
	op.Held = domain.Lock{Token: 1 << 40, Owner: "A", Resource: plan1, AcquiredAt: Start, ExpiresAt: Start.Add(10 * time.Second)}
	ops := []application.Op{op}
	if cur != nil {
		op.Held = *cur
		op.Held.Owner = "A"
		ops = append(ops, op)
	}
	return ops
}

// decides reports whether the store decides kind in the state named plain.
func decides(t *testing.T, newRepo NewRepository, kind application.OpKind, plain string) bool {
	t.Helper()
	for _, tc := range resourceStates() {
		if tc.name != plain {
			continue
		}
		repo := newRepo(t)
		ops := opsOn(kind, mustStore(t, repo, tc.cur))
		op := ops[len(ops)-1]
		op.At = func() (time.Time, time.Time) { return Start, Start.Add(stateTTL) }
		got, err := repo.(application.OneStatement).Apply(t.Context(), op)
		require.NoError(t, err)
		return got.Kind != application.ChangeNone
	}
	panic("locktest: no state " + plain)
}

// checkOp carries out op through the store's Apply on cur and compares
// what it did, and the store afterwards, with op's rule.
func checkOp(t *testing.T, repo application.LockRepository, cur *domain.Lock, op application.Op) {
	t.Helper()
	now, expires := Start, Start.Add(stateTTL)
	op.At = func() (time.Time, time.Time) { return now, expires }
	want, wantErr := op.Decide(cur, now, expires)
	got, err := repo.(application.OneStatement).Apply(t.Context(), op)
	_, decidesAll := repo.(interface{ DecidesAll() })
	renewal := op.Kind == application.OpRenew || op.Kind == application.OpRenewToken
	if op.Kind == application.OpTake {
		require.NotEqual(t, application.ChangeExtend, want.Kind, "Take's rule never re-enters")
		assert.NotEqual(t, application.ChangeExtend, got.Kind, "a Take never re-enters")
	}
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
	case err == nil && got.Kind == application.ChangeNone:
		// Left to Update. A store may decide only some cases (SQLite's, a
		// free resource), and leaves a renewal's refusals to Update.
		if (renewal && wantErr == nil) || (!renewal && decidesAll) {
			require.Equal(t, application.ChangeExtend, want.Kind, "only an extension may be left to Update, the rule says %v, %v", want, wantErr)
			assert.Less(t, cur.ExpiresAt.Sub(now), undecidedMargin, "an extension well before the expiry is decided")
		}
		unchanged()
	case renewal:
		require.NoError(t, err, "a renewal's every outcome but an extension is left to Update")
		require.NoError(t, wantErr, "the store extended where the rule says %v", wantErr)
		require.Equal(t, application.ChangeExtend, want.Kind)
		assert.Equal(t, application.ChangeExtend, got.Kind)
		l := *cur
		l.ExpiresAt = want.Lock.ExpiresAt
		assert.Equal(t, l, got.Lock, "the token and the acquisition time stay, the expiry moves")
		assert.Equal(t, l, after)
	case wantErr != nil:
		var ce *domain.LockConflictError
		require.ErrorAs(t, err, &ce, "the rule refuses: %v", wantErr)
		assert.Equal(t, wantErr, err, "the refusal names the holder as stored, at now")
		unchanged()
	case want.Kind == application.ChangeExtend:
		require.NoError(t, err)
		assert.Equal(t, application.ChangeExtend, got.Kind, "a re-entry")
		assert.Nil(t, got.Previous)
		l := *cur
		l.ExpiresAt = want.Lock.ExpiresAt
		assert.Equal(t, l, got.Lock, "the token and the acquisition time stay, the expiry moves")
		assert.Equal(t, l, after)
		assert.False(t, after.ExpiresAt.Before(cur.ExpiresAt), "a re-entry never shortens the lock: it expired at %s, now at %s",
			cur.ExpiresAt, after.ExpiresAt)
	default: // ChangeInsert
		require.NoError(t, err)
		assert.Equal(t, application.ChangeInsert, got.Kind)
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
