package entstore_test

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/entstore"
)

func TestMigrationVersion(t *testing.T) {
	fsys := fstest.MapFS{
		"20261129190022_m4_001_concurrency_locks.sql": {},
		"20261201000000_m4_002_other.sql":             {},
		"atlas.sum":                                   {},
	}
	v, err := entstore.MigrationVersion(fsys, "m4_001_concurrency_locks")
	require.NoError(t, err)
	assert.Equal(t, int64(20261129190022), v)
	_, err = entstore.MigrationVersion(fsys, "m9_nope")
	require.Error(t, err)
	assert.Equal(t, "m4_002_other", entstore.MigrationName("migrations/20261201000000_m4_002_other.sql"))
}
