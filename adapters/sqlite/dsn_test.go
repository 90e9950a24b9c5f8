package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/domain"
)

// inMemoryDSNs are names that SQLite opens as something other than one file
// shared by every connection: each connection of the store would get a
// database of its own.
var inMemoryDSNs = []string{
	":memory:",
	"file::memory:",
	"file::memory:?cache=shared",
	"file:x?mode=memory",
	"file:locks?mode=memory&cache=shared",
	"file:x.db?mode=rw&mode=memory",
	"file:%3Amemory%3A",
	"file:/locks.db?vfs=memdb",
	"file:",              // an empty name: a temporary database per connection
	"file:?cache=shared", // the same
	"file://localhost",   // the same, after the authority
}

// requireMemoryRefused checks that err is the validation error that points
// to locks.MemoryDatabase.
func requireMemoryRefused(t *testing.T, err error) {
	t.Helper()
	var ve *domain.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "database", ve.Field)
	assert.Contains(t, ve.Reason, "locks.MemoryDatabase")
}

func TestDSN_InMemoryRefused(t *testing.T) {
	ctx := context.Background()
	for _, dsn := range inMemoryDSNs {
		t.Run(dsn, func(t *testing.T) {
			// Whatever goes wrong, nothing may appear in the working
			// directory (a file named ":memory:", say).
			dir := t.TempDir()
			t.Chdir(dir)

			_, err := sqlite.DSN(dsn, 0)
			requireMemoryRefused(t, err)
			_, err = sqlite.Open(ctx, dsn, sqlite.Options{})
			requireMemoryRefused(t, err)
			_, err = sqlite.OpenReadOnly(ctx, dsn, sqlite.Options{})
			requireMemoryRefused(t, err)
			requireMemoryRefused(t, sqlite.CheckWritable(dsn))
			// Through the module, as an application configures it.
			_, err = locks.Open(ctx, locks.Config{Database: dsn})
			if dsn == locks.MemoryDatabase {
				require.NoError(t, err, "the module keeps these locks in memory itself")
			} else {
				requireMemoryRefused(t, err)
			}

			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, entries, "nothing is created on disk")
		})
	}
}

func TestDSN_Files(t *testing.T) {
	ctx := context.Background()
	t.Run("SharedCacheFile", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "locks.db")
		db, err := sqlite.Open(ctx, "file:"+path+"?cache=shared", sqlite.Options{})
		require.NoError(t, err)
		require.NoError(t, db.Close())
		assert.FileExists(t, path)
	})
	t.Run("FileNamedLikeMemory", func(t *testing.T) {
		dir := t.TempDir()
		t.Chdir(dir)
		db, err := sqlite.Open(ctx, ":memory:.db", sqlite.Options{})
		require.NoError(t, err)
		require.NoError(t, db.Close())
		assert.FileExists(t, filepath.Join(dir, ":memory:.db"))
	})
	t.Run("LocalhostAuthority", func(t *testing.T) {
		// SQLite reads "file://localhost/path" as /path: the file created
		// private beforehand must be that one.
		path := filepath.Join(t.TempDir(), "locks.db")
		db, err := sqlite.Open(ctx, "file://localhost"+path, sqlite.Options{})
		require.NoError(t, err)
		assert.Equal(t, path, db.Path())
		require.NoError(t, db.Close())
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	})
}

// A path with two leading slashes or more is the file of one, not a URI
// authority ("file://tmp/x.db"), which SQLite refused after creating
// "/x.db".
func TestDSN_LeadingSlashes(t *testing.T) {
	want, err := sqlite.DSN("/tmp/x.db", 0)
	require.NoError(t, err)
	for _, p := range []string{"//tmp/x.db", "///tmp/x.db"} {
		got, err := sqlite.DSN(p, 0)
		require.NoError(t, err)
		assert.Equal(t, want, got, p)
	}
}

// An access mode SQLite does not know is refused before anything is
// created (SQLite refused it only after the adapter had made the file).
func TestDSN_UnknownMode(t *testing.T) {
	for _, uri := range []string{"file:n.db?mode=RO", "file:n.db?mode=ro#x", "file:n.db?mode=readonly"} {
		_, err := sqlite.DSN(uri, 0)
		var v *domain.ValidationError
		require.ErrorAs(t, err, &v, uri)
		assert.Contains(t, err.Error(), "none of SQLite's access modes", uri)
	}
	for _, uri := range []string{"file:n.db?mode=rwc", "file:n.db?mode=rw", "file:n.db?mode=ro"} {
		_, err := sqlite.DSN(uri, 0)
		require.NoError(t, err, uri)
	}
}

// TestDSN_ParametersTheModuleDecides: a file: URI parameter that would
// break what the module promises (the journal it keeps, a store every
// process can write, the file locks that keep processes apart, a file
// left as it was) is refused before anything is created, with an error
// that names it; one that does not is accepted.
func TestDSN_ParametersTheModuleDecides(t *testing.T) {
	ctx := context.Background()
	for query, says := range map[string]string{
		"_pragma=journal_mode(delete)":                        "_pragma=journal_mode(delete)",
		"_pragma=JOURNAL_MODE%3DWAL":                          "_pragma=JOURNAL_MODE=WAL",
		"_pragma=main.journal_mode(delete)":                   "_journal_mode=",
		"_pragma=%20journal_mode%20(truncate)":                "journal_mode",
		"_pragma=synchronous(full)":                           "_synchronous=",
		"_pragma=busy_timeout(100)":                           "_busy_timeout=",
		"_pragma=locking_mode(exclusive)":                     "locking_mode",
		"_pragma=wal_autocheckpoint(1)":                       "checkpoints",
		"_pragma=journal_size_limit(1)":                       "checkpoints",
		"_pragma=user_version(7)":                             "user_version",
		"_pragma=foreign_keys(1)%3Bpragma%20journal_mode=off": "one pragma",
		"_journal_mode=OFF":                                   "_journal_mode=OFF",
		"_journal=memory":                                     "_journal=memory",
		"nolock=1":                                            "nolock=1",
		"vfs=unix-none":                                       "vfs=unix-none",
		"vfs=unix-dotfile":                                    "vfs=unix-dotfile",
	} {
		t.Run(query, func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			uri := "file:x.db?" + query
			for _, open := range []func() error{
				func() error { _, err := sqlite.DSN(uri, 0); return err },
				func() error { _, err := sqlite.Open(ctx, uri, sqlite.Options{}); return err },
				func() error { _, err := locks.Open(ctx, locks.Config{Database: uri}); return err },
			} {
				err := open()
				var ve *domain.ValidationError
				require.ErrorAs(t, err, &ve)
				assert.Equal(t, "database", ve.Field)
				assert.Contains(t, ve.Reason, says)
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, entries, "a refused URI creates nothing")
		})
	}
	for _, query := range []string{"_pragma=foreign_keys(1)", "_pragma=cache_size(-4000)", "_journal_mode=DELETE",
		"_journal=truncate", "_synchronous=FULL", "_query_only=0", "nolock=0", "vfs=unix", "_pragma=locking_mode"} {
		path := filepath.Join(t.TempDir(), "x.db")
		db, err := sqlite.Open(ctx, "file:"+path+"?"+query, sqlite.Options{})
		require.NoError(t, err, query)
		require.NoError(t, db.Close())
	}
}

// TestDSN_QueryOnlyIsReadOnly: a URI that makes every connection read-only
// with query_only is refused by Open as mode=ro is, before anything is
// created (it used to create the file and fail at the first write).
func TestDSN_QueryOnlyIsReadOnly(t *testing.T) {
	ctx := context.Background()
	for _, query := range []string{"_pragma=query_only(1)", "_pragma=QUERY_ONLY%20=%20true", "_query_only=1", "_query_only=yes"} {
		dir := t.TempDir()
		t.Chdir(dir)
		_, err := sqlite.Open(ctx, "file:x.db?"+query, sqlite.Options{})
		require.True(t, domain.IsStoreKind(err, domain.StoreReadOnly), "%s: %v", query, err)
		assert.ErrorContains(t, err, "drop ", query)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, entries, "%s: a refused URI creates nothing", query)
	}
}
