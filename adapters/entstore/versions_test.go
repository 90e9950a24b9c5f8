package entstore_test

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
)

func TestMigrationVersions(t *testing.T) {
	fsys := fstest.MapFS{
		"20261201000000_m4_002_other.sql":             {},
		"9_m0_short.sql":                              {},
		"20261129190022_m4_001_concurrency_locks.sql": {},
		"atlas.sum": {},
	}
	got, err := entstore.MigrationVersions(fsys)
	require.NoError(t, err)
	assert.Equal(t, []int64{9, 20261129190022, 20261201000000}, got, "in ascending order of version, not of name")

	_, err = entstore.MigrationVersions(fstest.MapFS{"x_nope.sql": {}})
	require.Error(t, err)
}
