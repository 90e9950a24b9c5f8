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

// testRenewer holds a store that renews by itself (application.Renewer)
// to the Go rule, application.DecideRenew, through resourceStates: it
// must extend exactly where the rule extends (a lock within
// undecidedMargin of its expiry may be left to Update, since the store
// checks activity at the time of its write), and write nothing anywhere
// else.
func testRenewer(t *testing.T, newRepo NewRepository) {
	if _, ok := newRepo(t).(application.Renewer); !ok {
		t.Skip("the store does not renew by itself")
	}
	for _, tc := range resourceStates() {
		run(t, tc.name, func(t *testing.T) {
			repo := newRepo(t)
			cur := mustStore(t, repo, tc.cur)
			now, expires := Start, Start.Add(stateTTL)
			want, wantErr := application.DecideRenew(cur, "A", plan1, now, expires)
			got, err := repo.(application.Renewer).RenewAt(t.Context(), plan1, "A", func() (time.Time, time.Time) { return now, expires })
			after, gerr := repo.Get(t.Context(), plan1)
			if errors.Is(gerr, domain.ErrNotFound) {
				gerr = nil
			}
			require.NoError(t, gerr)
			if err != nil {
				require.ErrorIs(t, err, application.ErrUndecided, "a Renewer leaves every other outcome to Update")
				if wantErr == nil {
					assert.Less(t, cur.ExpiresAt.Sub(now), undecidedMargin, "an extension well before the expiry is decided")
				}
				if cur == nil {
					assert.Zero(t, after, "nothing was written")
				} else {
					assert.Equal(t, *cur, after, "nothing was written")
				}
				return
			}
			require.NoError(t, wantErr, "the store extended where the rule says %v", wantErr)
			require.Equal(t, application.ChangeExtend, want.Kind)
			l := *cur
			l.ExpiresAt = want.Lock.ExpiresAt
			assert.Equal(t, l, got, "the token and the acquisition time stay, the expiry moves")
			assert.Equal(t, l, after)
		})
	}
}
