package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// A cleanup must not delete a lock that a renew extended while the cleanup
// waited for the row. The renew's commit is held open by a deferred
// trigger that sleeps, so the cleanup surely queues behind it.
func TestDeleteExpired_SparesALockRenewedMeanwhile(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	db, err := postgres.Open(ctx, dsn, postgres.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	repo := postgres.NewLockRepository(db)
	start := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	mc := clock.NewMock()
	mc.Set(start)
	svc, err := application.NewLockService(repo, mc, 0)
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "A", plan1, 5*time.Second)
	require.NoError(t, err)

	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer admin.Close()
	slowCommits(t, admin, 2)

	mc.Set(start.Add(4 * time.Second)) // one second before the expiry
	renewed := make(chan error, 1)
	go func() { _, err := svc.Renew(ctx, "A", plan1, 5*time.Second); renewed <- err }()
	// Wait until the renew has updated the row and sleeps in its commit.
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "the renew never reached its commit")

	// A cleanup by a host whose clock is two seconds ahead: at its now,
	// the row it can see has expired.
	n, err := repo.DeleteExpired(ctx, start.Add(6*time.Second), 1000)
	require.NoError(t, err)
	require.NoError(t, <-renewed, "the renew succeeded")
	assert.Zero(t, n, "the cleanup deleted a lock that had been renewed")
	l, err := repo.Get(ctx, plan1)
	require.NoError(t, err, "the renewed lock is still stored")
	assert.Equal(t, start.Add(9*time.Second), l.ExpiresAt)
}

// slowCommits makes every transaction that updates a lock sleep for
// seconds in its commit (a deferred trigger), so that another statement
// surely queues behind it.
func slowCommits(t *testing.T, admin *sql.DB, seconds int) {
	t.Helper()
	for _, q := range []string{
		fmt.Sprintf(`CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%d); RETURN NULL; END $$`, seconds),
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON locks DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`,
	} {
		_, err := admin.Exec(q)
		require.NoError(t, err, q)
	}
}

// List orders ids by their bytes whatever the database's collation; an
// ICU en-US database sorts "_x a a-2 a1 B Zeta" by itself.
func TestList_ByteOrderUnderICUCollation(t *testing.T) {
	base := testdb.Postgres(t)
	ctx := context.Background()
	name := fmt.Sprintf("locks_icu_%d", os.Getpid())
	admin, err := sql.Open("pgx", os.Getenv(testdb.EnvPostgres))
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name)
	_, err = admin.Exec("CREATE DATABASE " + name + " TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
	if err != nil {
		t.Skipf("this server cannot create an ICU database: %v", err)
	}
	t.Cleanup(func() {
		_, err := admin.Exec("DROP DATABASE " + name + " WITH (FORCE)")
		require.NoError(t, err)
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.Path = "/" + name
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()

	db, err := postgres.Open(ctx, u.String(), postgres.Options{})
	require.NoError(t, err)
	defer db.Close()
	svc, err := application.NewLockService(postgres.NewLockRepository(db), clock.New(), 0)
	require.NoError(t, err)
	for _, id := range []string{"a1", "Zeta", "_x", "a-2", "B", "a"} {
		_, err := svc.Acquire(ctx, "A", domain.ResourceRef{Type: domain.ResourcePlan, ID: id}, 0)
		require.NoError(t, err)
	}
	all, err := svc.List(ctx, application.ListOptions{})
	require.NoError(t, err)
	var got []string
	for _, l := range all {
		got = append(got, l.Resource.ID)
	}
	assert.Equal(t, []string{"B", "Zeta", "_x", "a", "a-2", "a1"}, got)
}
