package sqlite_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
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
	return mustCreateStoreIn(t, t.TempDir())
}

// mustCreateStoreIn is mustCreateStore in the directory dir.
func mustCreateStoreIn(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "locks.db")
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

// TestOpenReadOnly_WriterMeanwhile inspects a database that no process has
// open (no -wal file), while another process starts writing to it: the
// inspection must read what the writer commits, including what a checkpoint
// has copied into the database file, and never fail.
func TestOpenReadOnly_WriterMeanwhile(t *testing.T) {
	ctx := context.Background()
	path := mustCreateStore(t)
	require.NoFileExists(t, path+"-wal")
	before := dirState(t, filepath.Dir(path))
	db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	repo := sqlite.NewLockRepository(db)
	count := func() int {
		t.Helper()
		ls, err := repo.List(ctx, application.ListFilter{})
		require.NoError(t, err, "the inspection fails while another process writes")
		return len(ls)
	}
	require.Equal(t, 1, count())

	// Reads run all along, on several connections, and must never fail
	// nor go back in time.
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				ls, err := repo.List(ctx, application.ListFilter{})
				if !assert.NoError(t, err, "the inspection fails while another process writes") {
					return
				}
				if !assert.GreaterOrEqual(t, len(ls), last, "a later read misses locks an earlier one saw") {
					return
				}
				last = len(ls)
			}
		}()
	}
	// Each acquire is a commit of a few pages: 1500 of them pass SQLite's
	// automatic checkpoint (1000 pages) more than once.
	const n = 1500
	stop := startWriter(t, path, n)
	close(done)
	wg.Wait()
	assert.Equal(t, n+1, count(), "the inspection reads what the writer committed")
	_, err = repo.Get(ctx, domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprintf("w%d", n-1)})
	assert.NoError(t, err, "the last commit is read")

	stop() // the writer closes, and cannot checkpoint while the inspection reads
	assert.Equal(t, n+1, count(), "the inspection still reads every commit once the writer is gone")
	require.NoError(t, db.Close())
	after := dirState(t, filepath.Dir(path))
	assert.ElementsMatch(t, keys(before), keys(after), "the last connection to close removes -wal and -shm")
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
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
	t.Run("AnotherApplicationsTables", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "app.db")
		_, err := rawDB(t, path).Exec("CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT); CREATE TABLE accounts (id INTEGER)")
		require.NoError(t, err)
		db, err := sqlite.OpenReadOnly(ctx, path, sqlite.Options{})
		require.NoError(t, err)
		defer db.Close()
		st, err := db.Schema(ctx)
		require.NoError(t, err)
		assert.Equal(t, sqlite.SchemaState{OtherTables: []string{"accounts", "notes"}}, st, "SQLite's own sqlite_sequence is not another application's")
	})
}

// TestOpenReadOnly_Permissions inspects databases that this user may not
// write, as user nobody when the tests run as root (root ignores permission
// bits, and CI runs as root).
func TestOpenReadOnly_Permissions(t *testing.T) {
	asNobody := os.Geteuid() == 0
	// inspect runs the inspection in another process, and checks that it
	// left the directory as it found it.
	inspect := func(t *testing.T, path string) workerReport {
		t.Helper()
		before := dirState(t, filepath.Dir(path))
		r := runWorker(t, "inspect", path, asNobody)
		assert.Equal(t, before, dirState(t, filepath.Dir(path)), "nothing is created beside the database")
		return r
	}
	// Nobody can write these, so nothing can change them while they are
	// read, and they are read without -wal or -shm files.
	t.Run("ReadOnlyFile", func(t *testing.T) {
		path := mustCreateStoreIn(t, reachableDir(t, 0o755))
		require.NoError(t, os.Chmod(path, 0o444))
		assert.Equal(t, workerReport{Owner: "owner"}, inspect(t, path))
	})
	t.Run("ReadOnlyDirectory", func(t *testing.T) {
		dir := reachableDir(t, 0o755)
		path := mustCreateStoreIn(t, dir)
		require.NoError(t, os.Chmod(path, 0o644))
		require.NoError(t, os.Chmod(dir, 0o555))
		assert.Equal(t, workerReport{Owner: "owner"}, inspect(t, path))
	})

	// The cases below need a database that belongs to another user.
	if !asNobody {
		t.Log("not root: the cases of another user's database are not run")
		return
	}
	t.Run("AnotherUsersOpenDatabase", func(t *testing.T) {
		// The application keeps -wal and -shm while it runs: they are read
		// through, though this user cannot write them.
		path := mustCreateStoreIn(t, reachableDir(t, 0o755))
		require.NoError(t, os.Chmod(path, 0o644))
		stop := startWriter(t, path, 1)
		defer stop()
		require.FileExists(t, path+"-shm")
		assert.Equal(t, workerReport{Owner: "owner"}, inspect(t, path))
	})
	t.Run("AnotherUsersClosedDatabase", func(t *testing.T) {
		// This user may write the database (through its group) and the
		// directory, but -wal and -shm files it created would be its own,
		// and an application running as the owner could not write them.
		path := mustCreateStoreIn(t, reachableDir(t, 0o777))
		require.NoError(t, os.Chown(path, 0, nobody))
		require.NoError(t, os.Chmod(path, 0o664))
		r := inspect(t, path)
		assert.Equal(t, "unreachable", r.Kind, "%+v", r)
		assert.Contains(t, r.Error, "is not the database's owner")
		assert.Contains(t, r.Error, "inspect it as its owner or as root, or while the application has it open")
	})
	t.Run("OwnerWithoutRoomForWAL", func(t *testing.T) {
		// The owner cannot create -wal and -shm in root's directory; root
		// could write the database meanwhile, so it is not immutable.
		path := mustCreateStoreIn(t, reachableDir(t, 0o755))
		require.NoError(t, os.Chown(path, nobody, nobody))
		r := inspect(t, path)
		assert.Equal(t, "unreachable", r.Kind, "%+v", r)
		assert.Contains(t, r.Error, "write in directory "+filepath.Dir(path))
	})
	t.Run("RootHandsFilesToOwner", func(t *testing.T) {
		// SQLite, run as root, gives the -wal and -shm files it creates to
		// the database's owner; the last connection removes them.
		dir := reachableDir(t, 0o755)
		path := mustCreateStoreIn(t, dir)
		require.NoError(t, os.Chown(path, nobody, nobody))
		before := dirState(t, dir)
		db, err := sqlite.OpenReadOnly(context.Background(), path, sqlite.Options{})
		require.NoError(t, err)
		for _, f := range []string{path + "-wal", path + "-shm"} {
			fi, err := os.Stat(f)
			require.NoError(t, err)
			assert.Equal(t, uint32(nobody), fileUID(t, fi), f)
		}
		require.NoError(t, db.Close())
		assert.Equal(t, before, dirState(t, dir))
	})
}

func TestCheckWritable(t *testing.T) {
	path := mustCreateStore(t)
	assert.NoError(t, sqlite.CheckWritable(path))
	assert.NoError(t, sqlite.CheckWritable("file:"+path+"?_busy_timeout=100"))

	missing := filepath.Join(t.TempDir(), "missing.db")
	assert.ErrorIs(t, sqlite.CheckWritable(missing), fs.ErrNotExist)
	assert.NoFileExists(t, missing)

	// Root may write anything: the checks run as nobody under root.
	asNobody := os.Geteuid() == 0
	t.Run("ReadOnlyFile", func(t *testing.T) {
		path := mustCreateStoreIn(t, reachableDir(t, 0o777))
		require.NoError(t, os.Chmod(path, 0o444))
		r := runWorker(t, "check-writable", path, asNobody)
		assert.Equal(t, "read-only", r.Kind, "%+v", r)
		assert.Contains(t, r.Error, path)
	})
	t.Run("ReadOnlyDirectory", func(t *testing.T) {
		dir := reachableDir(t, 0o755)
		path := mustCreateStoreIn(t, dir)
		require.NoError(t, os.Chmod(path, 0o666))
		require.NoError(t, os.Chmod(dir, 0o555))
		r := runWorker(t, "check-writable", path, asNobody)
		assert.Equal(t, "read-only", r.Kind, "%+v", r)
		assert.Contains(t, r.Error, "write in directory "+dir)
	})
}
