package tests

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// Goroutines that Take one resource with the README's owner, c.Owner(),
// never both hold it, each gets an acquisition of its own (a new token,
// never the previous holder's, re-entered before its release reached the
// store), and none's Release deletes another's lock (issue 19, item 3): a
// handle is one acquisition, and handles of one container exclude each
// other whatever owner they carry.
func TestHandles_SameOwnerExcludeEachOther(t *testing.T) {
	each := func(t *testing.T, database string) {
		c := MustOpen(t, locks.Config{Database: database, LocalTime: true})
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "shared"}
		ctx := context.Background()

		t.Run("SecondTakeIsRefused", func(t *testing.T) {
			first, err := c.Locks.Take(ctx, c.Owner(), ref, application.AcquireOptions{TTL: time.Minute})
			require.NoError(t, err)
			defer first.Release(ctx)
			second, err := c.Locks.Take(ctx, c.Owner(), ref, application.AcquireOptions{TTL: time.Minute})
			var conflict *domain.LockConflictError
			assert.ErrorAs(t, err, &conflict, "a second handle on a resource held by a handle of the same container")
			if second != nil {
				assert.NotEqual(t, first.Lock().Token, second.Lock().Token, "the second handle took the first's acquisition")
				_, rerr := second.Release(ctx)
				assert.NoError(t, rerr)
			}
			cur, err := c.Locks.Get(ctx, ref)
			require.NoError(t, err, "the first handle's lock must outlive the second handle's Release")
			assert.Equal(t, first.Lock().Token, cur.Token)
			assert.NoError(t, first.Lost(ctx), "the first handle still holds its lock")
			removed, err := first.Release(ctx)
			require.NoError(t, err)
			assert.True(t, removed, "the first handle's Release removes its own lock")
		})

		t.Run("GoroutinesTakeTurns", func(t *testing.T) {
			const goroutines, rounds = 4, 50
			wctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a deadlock guard
			defer cancel()
			var (
				inside   atomic.Int32
				overlaps atomic.Int32
				wg       sync.WaitGroup
				mu       sync.Mutex
				errs     []error
			)
			tokens := map[int64]bool{}
			seen := func(tok int64) bool { // reports whether tok is new
				mu.Lock()
				defer mu.Unlock()
				fresh := !tokens[tok]
				tokens[tok] = true
				return fresh
			}
			report := func(err error) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range rounds {
						h, err := c.Locks.Take(wctx, c.Owner(), ref, application.AcquireOptions{TTL: time.Minute, Wait: true})
						if err != nil {
							report(fmt.Errorf("goroutine %d, round %d: take: %w", g, i, err))
							return
						}
						held := h.KeepAlive(wctx) // as Do and the lifecycle service hold a lock
						if tok := h.Lock().Token; !seen(tok) {
							report(fmt.Errorf("goroutine %d, round %d: the handle has token %d, which an earlier handle had: it re-entered another acquisition", g, i, tok))
						}
						if inside.Add(1) > 1 {
							overlaps.Add(1)
						}
						runtime.Gosched() // the work: the other goroutine runs meanwhile
						cur, err := c.Locks.Get(wctx, ref)
						if err != nil || cur.Token != h.Lock().Token {
							report(fmt.Errorf("goroutine %d, round %d: holding token %d, the store has %+v (%v)", g, i, h.Lock().Token, cur, err))
						}
						inside.Add(-1)
						if err := context.Cause(held); err != nil {
							report(fmt.Errorf("goroutine %d, round %d: token %d lost while held: %w", g, i, h.Lock().Token, err))
						}
						removed, err := h.Release(wctx)
						if err != nil || !removed {
							report(fmt.Errorf("goroutine %d, round %d: release of token %d removed %v: %v", g, i, h.Lock().Token, removed, err))
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
				t.Error(err)
			}
			assert.Zero(t, overlaps.Load(), "rounds in which both goroutines held the resource")
			_, err := c.Locks.Get(ctx, ref)
			assert.True(t, errors.Is(err, domain.ErrNotFound), "every lock released: %v", err)
		})
	}
	t.Run("Memory", func(t *testing.T) { each(t, locks.MemoryDatabase) })
	t.Run("SQLite", func(t *testing.T) { each(t, filepath.Join(t.TempDir(), "locks.db")) })
	t.Run("PostgreSQL", func(t *testing.T) { each(t, testdb.Postgres(t)) })
}
