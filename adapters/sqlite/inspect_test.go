package sqlite_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// mustCreateStore makes a migrated database holding one lock, closed as a
// process leaves it on exit, and returns its path.
func mustCreateStore(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "locks.db")
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	svc, err := application.NewLockService(sqlite.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	_, err = svc.Acquire(context.Background(), "owner", domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, 0)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	return path
}

// dirState lists the files beside a database with their contents.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = string(b)
	}
	return out
}

func TestOpenReadOnly(t *testing.T) {
	ctx := context.Background()

	t.Run("ReadsAndChangesNothing", func(t *testing.T) {
		path := mustCreateStore(t)
		before := dirState(t, filepath.Dir(path))
		db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		repo := sqlite.NewLockRepository(db)
		l, err := repo.Get(ctx, domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"})
		require.NoError(t, err)
		assert.Equal(t, "owner", l.Owner)

		_, err = repo.DeleteAllOwned(ctx, "owner")
		assert.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "writes are refused: %v", err)
		require.NoError(t, db.Close())
		assert.Equal(t, before, dirState(t, filepath.Dir(path)), "no change, and no -wal or -shm file left behind")
	})
	t.Run("MissingFileIsNotCreated", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "missing.db")
		_, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		assert.ErrorIs(t, err, fs.ErrNotExist)
		assert.True(t, domain.IsStoreKind(err, domain.StoreUnreachable))
		assert.NoFileExists(t, path)
	})
	t.Run("NotADatabase", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "notes.txt")
		require.NoError(t, os.WriteFile(path, []byte("not a database"), 0o600))
		_, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		assert.True(t, domain.IsStoreKind(err, domain.StoreCorrupt), "%v", err)
	})
	t.Run("InMemoryHasNothingToInspect", func(t *testing.T) {
		_, err := sqlite.OpenReadOnly(ctx, ":memory:", sqlite.Options{})
		var ve *domain.ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "database", ve.Field)
	})
}

func TestDB_Schema(t *testing.T) {
	ctx := context.Background()
	t.Run("Migrated", func(t *testing.T) {
		db, err := sqlite.OpenReadOnly(ctx, mustCreateStore(t), sqlite.Options{})
		require.NoError(t, err)
		defer db.Close()
		st, err := db.Schema(ctx)
		require.NoError(t, err)
		assert.Equal(t, sqlite.SchemaState{MigrationApplied: true, LocksTable: true}, st)
	})
	t.Run("EmptyFile", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "empty.db")
		require.NoError(t, os.WriteFile(path, nil, 0o600))
		db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer db.Close()
		st, err := db.Schema(ctx)
		require.NoError(t, err)
		assert.Equal(t, sqlite.SchemaState{}, st)
	})
	t.Run("HandMadeTable", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "hand.db")
		_, err := rawDB(t, path).Exec("CREATE TABLE locks (id INTEGER PRIMARY KEY)")
		require.NoError(t, err)
		db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer db.Close()
		st, err := db.Schema(ctx)
		require.NoError(t, err)
		assert.Equal(t, sqlite.SchemaState{LocksTable: true}, st)
	})
}

func TestCheckWritable(t *testing.T) {
	path := mustCreateStore(t)
	assert.NoError(t, sqlite.CheckWritable(path))
	assert.NoError(t, sqlite.CheckWritable("file:"+path+"?_busy_timeout=100"))

	missing := filepath.Join(t.TempDir(), "missing.db")
	assert.ErrorIs(t, sqlite.CheckWritable(missing), fs.ErrNotExist)
	assert.NoFileExists(t, missing)

	if os.Geteuid() != 0 { // root may write anything
		require.NoError(t, os.Chmod(path, 0o400))
		assert.True(t, domain.IsStoreKind(sqlite.CheckWritable(path), domain.StoreReadOnly))
	}
}
