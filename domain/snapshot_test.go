package domain_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

// A stale snapshot is a busy store to whoever tests for one, and never a
// lost lock; its own text says what is true and what to do, with the
// database's report.
func TestStaleSnapshotError(t *testing.T) {
	cause := errors.New("database is locked (517)")
	var err error = &domain.StaleSnapshotError{Op: "check a fence", What: "the snapshot is old", Advice: "begin immediate", Err: cause}
	assert.ErrorIs(t, err, domain.ErrUnavailable)
	assert.ErrorIs(t, err, cause)
	assert.True(t, domain.IsStoreKind(err, domain.StoreBusy))
	assert.NotErrorIs(t, err, domain.ErrExpired)
	var se *domain.StoreError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "begin immediate", se.Advice)
	assert.Equal(t, "check a fence: the snapshot is old; begin immediate (database is locked (517))", err.Error())
}
