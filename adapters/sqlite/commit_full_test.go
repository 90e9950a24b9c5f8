package sqlite_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// fillUp acquires locks of owner on new resources until the database is
// full, and returns them.
func fillUp(t *testing.T, repo *sqlite.LockRepository, owner string) []domain.ResourceRef {
	t.Helper()
	var held []domain.ResourceRef
	for i := range 10_000 {
		ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 200))}
		_, err := repo.AcquireAt(context.Background(), ref, owner, timing())
		if err != nil {
			require.True(t, domain.IsStoreKind(err, domain.StoreFull), "%v", err)
			require.NotEmpty(t, held)
			return held
		}
		held = append(held, ref)
	}
	t.Fatal("the database never filled up")
	return nil
}

func timing() func() (time.Time, time.Time) {
	now := mockClock().Now()
	return func() (time.Time, time.Time) { return now, now.Add(time.Hour) }
}

// bigRef is a resource whose lock does not fit in a full database.
func bigRef(name string) domain.ResourceRef {
	return domain.ResourceRef{Type: domain.ResourcePlan, ID: "zz-" + name + strings.Repeat("y", 240)}
}

// TestGroupCommit_FailingMember: on a full database an acquire's insert
// fails, and SQLite may have ended the whole transaction with it: the
// acquire keeps its error, and the releases that shared its batch run
// again without it and succeed.
func TestGroupCommit_FailingMember(t *testing.T) {
	ctx := context.Background()
	for _, journal := range journals {
		t.Run(journal, func(t *testing.T) {
			db, _ := openJournal(t, journal, time.Second, "_pragma=max_page_count(40)")
			repo := sqlite.NewLockRepository(db)
			held := fillUp(t, repo, "alice")
			require.GreaterOrEqual(t, len(held), 3)
			type released struct {
				ok  bool
				err error
			}
			release := func(ref domain.ResourceRef, out *released) func() error {
				return func() error {
					out.ok, out.err = repo.DeleteOwned(ctx, ref, "alice")
					return nil
				}
			}
			acquire := func(ref domain.ResourceRef) func() error {
				return func() error {
					_, err := repo.AcquireAt(ctx, ref, "carol", timing())
					return err
				}
			}
			var rel [3]released
			finish := blockedLeader(t, db)
			res := queued(t, db,
				release(held[0], &rel[0]),
				acquire(bigRef("a")),
				release(held[1], &rel[1]),
				acquire(bigRef("b")),
				release(held[2], &rel[2]),
			)
			require.NoError(t, finish())
			full := 0
			for i, r := range res {
				err := <-r
				if i%2 == 1 && err != nil {
					// Whether one fits depends on the pages the releases
					// before it freed; one that does not fit is full.
					assert.True(t, domain.IsStoreKind(err, domain.StoreFull), "acquire %d: %v", i, err)
					full++
				}
			}
			require.NotZero(t, full, "no acquire of the batch failed: nothing was tested")
			for i, r := range rel {
				assert.NoError(t, r.err, "release %d", i)
				assert.True(t, r.ok, "release %d", i)
				_, err := repo.Get(ctx, held[i])
				assert.ErrorIs(t, err, domain.ErrNotFound, "release %d", i)
			}
		})
	}
}

// TestFullDatabase_ReleasesWhilePollersAcquire: on a full database,
// pollers that keep asking for new locks (and failing) share batches with
// the holder's releases; every release succeeds.
func TestFullDatabase_ReleasesWhilePollersAcquire(t *testing.T) {
	ctx := context.Background()
	for _, journal := range journals {
		t.Run(journal, func(t *testing.T) {
			db, _ := openJournal(t, journal, 5*time.Second, "_pragma=max_page_count(40)")
			repo := sqlite.NewLockRepository(db)
			held := fillUp(t, repo, "alice")
			svc, err := application.NewLockService(repo, mockClock(), time.Hour)
			require.NoError(t, err)

			stop := make(chan struct{})
			var polls atomic.Int64
			pollers := make(chan struct{})
			for p := range 4 {
				go func() {
					defer func() { pollers <- struct{}{} }()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						svc.Acquire(ctx, "poller", bigRef(fmt.Sprintf("%d-%d", p, i)), 0)
						polls.Add(1)
					}
				}()
			}
			// Four releasers, one release at a time each, so that the
			// batches mix releases with the pollers' acquires.
			refs := make(chan domain.ResourceRef, len(held))
			for _, ref := range held {
				refs <- ref
			}
			close(refs)
			errs := make(chan error, len(held))
			for range 4 {
				go func() {
					for ref := range refs {
						ok, err := svc.Release(ctx, "alice", ref)
						if err == nil && !ok {
							err = fmt.Errorf("release of %s found no lock", ref.ID[:4])
						}
						errs <- err
					}
				}()
			}
			failed := 0
			for range held {
				if err := <-errs; err != nil {
					failed++
					t.Log(err)
				}
			}
			close(stop)
			for range 4 {
				<-pollers
			}
			assert.Zero(t, failed, "of %d releases (%d polls meanwhile)", len(held), polls.Load())
		})
	}
}
