package application_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// failingRepo is a LockRepository whose every method fails with err and
// counts its calls: for the paths the contract suite cannot reach with a
// healthy store.
type failingRepo struct {
	err   error
	calls int
}

func (r *failingRepo) Update(context.Context, domain.ResourceRef, application.Decide) (domain.Lock, error) {
	r.calls++
	return domain.Lock{}, r.err
}
func (r *failingRepo) Get(context.Context, domain.ResourceRef) (domain.Lock, error) {
	r.calls++
	return domain.Lock{}, r.err
}
func (r *failingRepo) List(context.Context, application.ListFilter) ([]domain.Lock, error) {
	r.calls++
	return nil, r.err
}
func (r *failingRepo) DeleteOwned(context.Context, domain.ResourceRef, string) (bool, error) {
	r.calls++
	return false, r.err
}
func (r *failingRepo) DeleteToken(context.Context, domain.ResourceRef, int64, time.Time) (bool, error) {
	r.calls++
	return false, r.err
}
func (r *failingRepo) DeleteAllOwned(context.Context, string) (int, error) {
	r.calls++
	return 0, r.err
}
func (r *failingRepo) DeleteExpired(context.Context, time.Time, int) (int, error) {
	r.calls++
	return 0, r.err
}
func (r *failingRepo) CountExpired(context.Context, time.Time) (int, error) {
	r.calls++
	return 0, r.err
}

var plan = domain.ResourceRef{Type: domain.ResourcePlan, ID: "p"}

func TestLockService_StoreErrorsPassThrough(t *testing.T) {
	storeErr := &domain.StoreError{Op: "test", Kind: domain.StoreBusy}
	repo := &failingRepo{err: storeErr}
	svc, err := application.NewLockService(repo, clock.NewMock(), 0)
	require.NoError(t, err)
	ctx := context.Background()

	_, err = svc.Acquire(ctx, "A", plan, 0)
	require.ErrorIs(t, err, storeErr)
	_, err = svc.Renew(ctx, "A", plan, 0)
	require.ErrorIs(t, err, storeErr)
	_, err = svc.Release(ctx, "A", plan)
	require.ErrorIs(t, err, storeErr)
	_, err = svc.ReleaseAllForOwner(ctx, "A")
	require.ErrorIs(t, err, storeErr)
	_, err = svc.CleanupExpired(ctx)
	require.ErrorIs(t, err, storeErr)
	_, err = svc.StaleCount(ctx)
	require.ErrorIs(t, err, storeErr)
	_, err = svc.Get(ctx, plan)
	require.ErrorIs(t, err, storeErr)
	_, err = svc.List(ctx, application.ListOptions{})
	require.ErrorIs(t, err, storeErr)
	assert.Equal(t, 8, repo.calls)
}

func TestLockService_ValidationBeforeStore(t *testing.T) {
	repo := &failingRepo{err: &domain.StoreError{Op: "must not be reached"}}
	svc, err := application.NewLockService(repo, clock.NewMock(), 0)
	require.NoError(t, err)
	ctx := context.Background()
	bad := domain.ResourceRef{Type: "nope", ID: "p"}

	for name, call := range map[string]func() error{
		"Acquire":    func() error { _, err := svc.Acquire(ctx, "A", bad, 0); return err },
		"AcquireTTL": func() error { _, err := svc.Acquire(ctx, "A", plan, time.Second); return err },
		"Renew":      func() error { _, err := svc.Renew(ctx, "", plan, 0); return err },
		"Release":    func() error { _, err := svc.Release(ctx, "A", bad); return err },
		"ReleaseAll": func() error { _, err := svc.ReleaseAllForOwner(ctx, ""); return err },
		"Get":        func() error { _, err := svc.Get(ctx, bad); return err },
		"ListType":   func() error { _, err := svc.List(ctx, application.ListOptions{Type: "nope"}); return err },
		"ListOwner":  func() error { _, err := svc.List(ctx, application.ListOptions{Owner: " "}); return err },
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, call(), domain.ErrValidation)
		})
	}
	assert.Zero(t, repo.calls, "invalid input never reaches the store")
}

func TestNewLockService_DefaultTTL(t *testing.T) {
	svc, err := application.NewLockService(&failingRepo{}, clock.NewMock(), 0)
	require.NoError(t, err)
	assert.Equal(t, domain.DefaultLockTTL, svc.DefaultTTL())
	svc, err = application.NewLockService(&failingRepo{}, clock.NewMock(), time.Minute)
	require.NoError(t, err)
	assert.Equal(t, time.Minute, svc.DefaultTTL())
	_, err = application.NewLockService(&failingRepo{}, clock.NewMock(), time.Second)
	require.ErrorIs(t, err, domain.ErrValidation)
}

func TestLockService_CleanupStopsOnCancel(t *testing.T) {
	// A store that always has a full batch to delete: cleanup must still
	// stop once the context ends.
	repo := &fullBatches{}
	svc, err := application.NewLockService(repo, clock.NewMock(), 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	repo.after = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	n, err := svc.CleanupExpired(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 100+200+400, n, "reports what it purged before stopping")
}

type fullBatches struct {
	failingRepo
	batches int
	after   func(int)
}

func (r *fullBatches) DeleteExpired(_ context.Context, _ time.Time, limit int) (int, error) {
	r.batches++
	r.after(r.batches)
	return limit, nil
}
