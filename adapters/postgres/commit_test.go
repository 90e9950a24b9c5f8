package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// TestWrites_OnlyReleasesSkipTheWALFlush reads, at the commit of each
// write, the synchronous_commit it commits with (a deferred trigger runs
// just before the commit, in the writing transaction). An acquire and a
// renewal must wait for the flush: a lock the server forgets in a crash
// after its holder was told it holds it could be given to a second
// holder. A release need not: the lock it removed can only come back, as
// it was, until its expiry, which holds the resource longer but never
// gives it to two holders; and the next acquire of the resource, which
// waits for its own flush, flushes the release with it.
func TestWrites_OnlyReleasesSkipTheWALFlush(t *testing.T) {
	for _, mode := range []string{"alone", "in batches"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			dsn := testdb.Postgres(t)
			db, err := postgres.Open(ctx, dsn, postgres.Options{})
			require.NoError(t, err)
			defer db.Close()
			raw, err := sql.Open("pgx", dsn)
			require.NoError(t, err)
			defer raw.Close()
			for _, q := range []string{
				`CREATE TABLE commits (n bigserial, op text, mode text)`,
				`CREATE FUNCTION record_commit() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN INSERT INTO commits (op, mode) VALUES (TG_OP, current_setting('synchronous_commit')); RETURN NULL; END $$`,
				`CREATE CONSTRAINT TRIGGER record_commit AFTER INSERT OR UPDATE OR DELETE ON locks
				DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION record_commit()`,
			} {
				_, err := raw.ExecContext(ctx, q)
				require.NoError(t, err)
			}
			var repo *postgres.LockRepository = postgres.NewLockRepository(db)
			if mode == "in batches" {
				repo = repo.InBatches()
			}
			svc, err := application.NewLockService(repo, clock.New(), 0)
			require.NoError(t, err)
			ref := func(i int) domain.ResourceRef {
				return domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("p", i)}
			}

			_, err = svc.Acquire(ctx, "a", ref(1), time.Minute)
			require.NoError(t, err)
			_, err = svc.Renew(ctx, "a", ref(1), time.Minute)
			require.NoError(t, err)
			ok, err := svc.Release(ctx, "a", ref(1))
			require.NoError(t, err)
			require.True(t, ok)
			h, err := svc.Take(ctx, "a", ref(2), application.AcquireOptions{TTL: time.Minute})
			require.NoError(t, err)
			_, err = h.Renew(ctx)
			require.NoError(t, err)
			ok, err = h.Release(ctx)
			require.NoError(t, err)
			require.True(t, ok)
			_, err = svc.Acquire(ctx, "a", ref(3), time.Minute)
			require.NoError(t, err)
			n, err := svc.ReleaseAllForOwner(ctx, "a")
			require.NoError(t, err)
			require.Equal(t, 1, n)

			rows, err := raw.QueryContext(ctx, `SELECT op, mode FROM commits ORDER BY n`)
			require.NoError(t, err)
			var got []string
			for rows.Next() {
				var op, mode string
				require.NoError(t, rows.Scan(&op, &mode))
				got = append(got, op+" "+mode)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []string{
				"INSERT on", "UPDATE on", "DELETE off", // by owner
				"INSERT on", "UPDATE on", "DELETE off", // by token
				"INSERT on", "DELETE off", // all of an owner's
			}, got)
		})
	}
}
