package tests

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// A lock call inside Container.Write's fn made with fn's own context is
// refused at once, even when the caller's context never ends.
func TestWrite_NestedLockCallWithFnContextFailsAtOnce(t *testing.T) {
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db"), Owner: "app"})
	require.NoError(t, err)
	defer c.Close()
	var acqErr error
	werr := c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, acqErr = c.Locks.Acquire(ctx, c.Owner(), domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, 0)
		return acqErr
	})
	require.Error(t, acqErr)
	assert.Equal(t, acqErr, werr, "Write returns fn's error as it is")
	var se *domain.StoreError
	require.ErrorAs(t, acqErr, &se, "%v", acqErr)
	assert.Contains(t, acqErr.Error(), "inside DB.Write")
}

// A lock call inside fn made with another context (the closure that
// captures the caller's ctx) cannot be told from another goroutine's
// call waiting its turn: as docs/lifecycle.md says, it waits behind fn's
// own transaction, like a nested sync.Mutex.Lock, until its context
// ends, and then returns the context's error saying that it waited behind
// an application transaction. Nothing is acquired.
func TestWrite_NestedLockCallWithOuterContextWaitsUntilItEnds(t *testing.T) {
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db"), Owner: "app"})
	require.NoError(t, err)
	defer c.Close()
	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}
	outer, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	var acqErr error
	werr := c.Write(outer, func(_ context.Context, tx *sql.Tx) error {
		_, acqErr = c.Locks.Acquire(outer, c.Owner(), ref, 0)
		return acqErr
	})
	require.Error(t, acqErr)
	assert.True(t, errors.Is(acqErr, context.DeadlineExceeded), "the context's error: %v", acqErr)
	assert.Contains(t, acqErr.Error(), "waited behind an application transaction", "it says why it waited")
	assert.Contains(t, acqErr.Error(), "before or after the Write", "and what to do")
	assert.True(t, errors.Is(werr, context.DeadlineExceeded), "%v", werr)
	_, err = c.Locks.Get(ctx, ref)
	assert.ErrorIs(t, err, domain.ErrNotFound, "the nested call acquired nothing")
	_, err = c.Locks.Acquire(ctx, c.Owner(), ref, 0)
	require.NoError(t, err, "the write lock is free again once Write has returned")
}
