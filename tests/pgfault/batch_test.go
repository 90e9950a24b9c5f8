//go:build unix

package pgfault

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/pgserver"
	"github.com/cleveragents/locks/tests/testdb"
)

// A server that stops while a batch of group commit waits in it fails
// every member with the store's error, commits nothing of the batch, and
// the store works on once the server is back.
func TestFault_ServerRestartMidBatch(t *testing.T) {
	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			s := pgserver.Start(t)
			dsn := s.CreateDatabase("locks")
			ctx := context.Background()
			db, err := postgres.Open(ctx, dsn, postgres.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			b := &testdb.Batches{Store: postgres.NewLockRepository(db), Admin: s.Open("locks")}
			owners, refs, ctxs := make([]string, 4), make([]domain.ResourceRef, 4), make([]context.Context, 4)
			for i := range refs {
				owners[i], refs[i], ctxs[i] = fmt.Sprintf("o%d", i), plan(fmt.Sprintf("r%d", i)), ctx
			}
			out := b.Acquires(t, ctxs, owners, refs)
			s.Stop(mode)
			for i, ch := range out {
				select {
				case r := <-ch:
					requireStoreError(t, r.Err, domain.StoreUnreachable)
				case <-time.After(call):
					t.Fatalf("member %d heard nothing of the stopped server", i)
				}
			}
			s.Restart()
			require.Empty(t, lockRows(t, s.Open("locks")), "nothing of the batch committed")
			cctx, cancel := context.WithTimeout(ctx, call)
			defer cancel()
			a, err := b.Store.AcquireAt(cctx, refs[0], owners[0], testdb.Now(time.Minute))
			require.NoError(t, err)
			require.Equal(t, owners[0], a.Lock.Owner)
		})
	}
}
