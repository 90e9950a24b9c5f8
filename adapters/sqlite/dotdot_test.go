package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
)

// A name with ".." after a symbolic link to a directory names, for the
// kernel and so for SQLite, a file beside the link's target, not beside
// the link: "dir/link/../x.db" with link → dir/d1/d2 is dir/d1/x.db.
// Cleaned by hand first ("dir/x.db"), Open created the kernel's file and
// then refused the other, leaving a new empty file behind.
func TestOpen_DotDotAfterASymlinkIsTheKernelsFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "d1", "d2"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(dir, "d1", "d2"), filepath.Join(dir, "link")))
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "link")+"/../x.db", sqlite.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	assert.FileExists(t, filepath.Join(dir, "d1", "x.db"))
	assert.NoFileExists(t, filepath.Join(dir, "x.db"))
	assert.NoFileExists(t, filepath.Join(dir, "x.db-wake"), "side files beside the database, not beside the link")
}
