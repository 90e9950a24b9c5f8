package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// firstMigrationOnly migrates db as the release before the note column
// did: m4_001 alone, recorded in the module's own version table.
func firstMigrationOnly(t *testing.T, db *sql.DB) *goose.Provider {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("migrations/%d_*.sql", ourVersion(t)))
	require.NoError(t, err)
	require.Len(t, files, 1)
	data, err := os.ReadFile(files[0])
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectSQLite3, db, fstest.MapFS{filepath.Base(files[0]): {Data: data}},
		goose.WithTableName(versionTable))
	require.NoError(t, err)
	_, err = p.Up(context.Background())
	require.NoError(t, err)
	return p
}

// The statements of the release before the note: its writer names five
// columns, its readers six.
const (
	oldInsert = "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`) VALUES (?, ?, ?, ?, ?)"
	oldSelect = "SELECT `id`, `owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at` FROM `locks` ORDER BY `id`"
)

func TestOpen_NoteMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	raw := rawDB(t, path)
	old := firstMigrationOnly(t, raw)
	_, err := raw.Exec(oldInsert, "alice", "plan", "p1", "2026-12-01T09:00:00.000000Z", "2999-01-01T00:00:00.000000Z")
	require.NoError(t, err)

	db, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer db.Close()
	assert.Equal(t, ourVersions(t), versionRows(t, raw, versionTable), "the note's migration applied on top")
	svc, err := application.NewLockService(sqlite.NewLockRepository(db), testClock(), 0)
	require.NoError(t, err)

	p1 := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}
	kept, err := svc.Get(ctx, p1)
	require.NoError(t, err, "the lock stored before the upgrade is still there")
	assert.Equal(t, "alice", kept.Owner)
	assert.Empty(t, kept.Note, "a row of the earlier release has no note")
	_, err = svc.Acquire(ctx, "bob", p1, 0, application.WithNote("mine"))
	require.ErrorIs(t, err, domain.ErrConflict, "and still held")

	p2 := domain.ResourceRef{Type: domain.ResourcePlan, ID: "p2"}
	noted, err := svc.Acquire(ctx, "bob", p2, 0, application.WithNote("deploying v2"))
	require.NoError(t, err)

	t.Run("EarlierReleaseStillReads", func(t *testing.T) {
		// An earlier release's process on the same file reads and writes
		// the columns it knows; the note is no column of its.
		rows, err := raw.Query(oldSelect)
		require.NoError(t, err)
		defer rows.Close()
		var owners []string
		for rows.Next() {
			var id int64
			var owner, typ, rid, acquired, expires string
			require.NoError(t, rows.Scan(&id, &owner, &typ, &rid, &acquired, &expires))
			owners = append(owners, owner)
		}
		require.NoError(t, rows.Err())
		assert.Equal(t, []string{"alice", "bob"}, owners)
		_, err = raw.Exec(oldInsert, "carol", "plan", "p3", "2026-12-01T09:00:00.000000Z", "2999-01-01T00:00:00.000000Z")
		require.NoError(t, err, "its insert leaves the note NULL")
		got, err := svc.List(ctx, application.ListOptions{})
		require.NoError(t, err)
		require.Len(t, got, 3)
		assert.Equal(t, []string{"", noted.Note, ""}, []string{got[0].Note, got[1].Note, got[2].Note})
	})
	t.Run("EarlierReleaseOpensIt", func(t *testing.T) {
		// Its migration step finds nothing to do at a later version.
		_, err := old.Up(ctx)
		require.NoError(t, err)
		pending, err := old.HasPending(ctx)
		require.NoError(t, err)
		assert.False(t, pending)
	})
}

func testClock() application.Clock { return fixedClock{time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)} }

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }
