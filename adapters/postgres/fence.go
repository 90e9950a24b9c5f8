package postgres

import (
	"context"
	"fmt"
	"time"

	"entgo.io/ent/dialect"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
)

// CheckFence is Container.CheckFence's check on PostgreSQL, in the
// caller's transaction q (entstore.CheckFence): that f's lock is held and
// active at now, kept from changing hands until q ends.
//
// The check is a SELECT of that row FOR KEY SHARE. The row lock is held
// until q ends: it makes the DELETE of a release, a takeover or a cleanup
// wait for q's commit, and then, at READ COMMITTED (the lock store pins it
// for its own transactions), the DELETE re-reads the row and goes ahead on
// the lock as it is then. The holder's renewal, an UPDATE of expires_at
// only, which is not a key column, does not wait. Run q at READ COMMITTED
// too, so that the check and its explanation read the lock as it is now.
// The check also sets idle_in_transaction_session_timeout for the rest of
// q: q may idle between its statements for the lock's time left at now
// plus a second, after which the server ends q's session and rolls q
// back, so that a holder stopped or cut off inside q keeps its resource
// from others no longer than its lock lasts. Check the fence again to
// extend it (after a renewal: the bound is the shortest time left of the
// locks of q's fences, each as last checked, never above q's own
// timeout), and keep q busy or short. At REPEATABLE READ or SERIALIZABLE
// the check still never succeeds on a lock removed since q's snapshot
// (PostgreSQL fails the locking read with a serialization failure, to be
// retried in a new transaction), but it cannot see a lock acquired or
// renewed since: a refusal there is a *domain.StaleSnapshotError ("the
// lock may be held"), unless the snapshot shows a newer lock on the
// resource.
//
// Errors: those of entstore.CheckFence, and *domain.StaleSnapshotError for
// a q above READ COMMITTED whose snapshot does not show the lock held,
// where it may be (read the lock outside q to know: Container.CheckFence
// does).
func CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time) error {
	if err := entstore.CheckFence(ctx, q, dialect.Postgres, f, now, fenceHolds); err != nil {
		return snapshotMayBeOld(ctx, q, f, err)
	}
	return nil
}

// fenceHolds runs fenceSQL and reports whether the fence holds.
func fenceHolds(ctx context.Context, q entstore.Querier, f application.Fence, now string) (bool, error) {
	rows, err := q.QueryContext(ctx, fenceSQL, f.Token, f.Owner, string(f.Resource.Type), f.Resource.ID, now)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	found := rows.Next()
	if err := rows.Err(); err != nil {
		return false, err
	}
	return found, rows.Close()
}

// fenceSQL is the check on PostgreSQL: the lock row, held FOR KEY SHARE
// until the caller's transaction ends, if it is the fence's lock and
// active at now ($1 the token, $2 the owner, $3 and $4 the resource, $5
// now as stored). A row lock held by a transaction whose client stopped
// (SIGSTOP, a cut link: the server sees an idle transaction) would keep
// every takeover, release and cleanup of the resource waiting for as long
// as the server takes to notice, hours with TCP's default keepalives: so
// the check also sets idle_in_transaction_session_timeout for the rest of
// the transaction to the shortest time left at now (the service's
// estimate of the server's time) of the locks of the transaction's
// fences, each as last checked, plus a second (fenceIdleMargin), and no
// longer than the transaction's own timeout. A check of a fence again,
// after its lock was renewed, replaces that lock's expiry and so extends
// the bound; a transaction that checks several fences keeps the shortest.
// What the checks found is kept for the rest of the transaction in the
// setting fenceState (set_config, local to the transaction): the expiry of
// each fence's lock by token, the transaction's own timeout from before
// its first check ("base", null for none), and the bound last set
// ("set"). A timeout that is not the one last set was set by the
// transaction itself since (SET LOCAL), and becomes its own. Every step is
// MATERIALIZED so that each value is computed once, from the settings as
// they were before the statement's set_config calls change them.
//
// A transaction that idles longer than the bound is ended by the server,
// and rolled back; one that runs statements is not. The server measures
// the idle time from the transaction's last statement: one that runs on
// past its fence check and then stops keeps others out for up to that
// time after its last statement (PostgreSQL 17's transaction_timeout
// would bound the whole; older servers are supported). The bound is at
// most maxIdleTimeout, the most the setting takes.
var fenceSQL = pgStatement(`WITH s AS MATERIALIZED (
  SELECT NULLIF(current_setting('` + fenceState + `', true), '')::jsonb AS st,
    (SELECT NULLIF(setting::bigint, 0) FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout') AS ms
), l AS MATERIALIZED (
  SELECT {id}, {expires} FROM {locks}
  WHERE {id} = $1::bigint AND {owner} = $2::varchar AND {type} = $3::varchar AND {rid} = $4::varchar AND {expires} > $5::varchar
  FOR KEY SHARE
), n AS MATERIALIZED (
  SELECT l.{id},
    CASE WHEN s.st IS NULL OR s.ms IS DISTINCT FROM (s.st->>'set')::bigint THEN s.ms ELSE (s.st->>'base')::bigint END AS base,
    COALESCE(s.st->'f', '{}'::jsonb) || jsonb_build_object(l.{id}::text, l.{expires}) AS f
  FROM l, s
), b AS MATERIALIZED (
  SELECT n.*, LEAST(
      (SELECT GREATEST(1, CEIL(EXTRACT(EPOCH FROM (MIN(e.value::timestamp) - $5::varchar::timestamp)) * 1000)) FROM jsonb_each_text(n.f) e) + ` + fmt.Sprint(fenceIdleMargin.Milliseconds()) + `,
      COALESCE(n.base, ` + fmt.Sprint(maxIdleTimeout) + `), ` + fmt.Sprint(maxIdleTimeout) + `)::bigint AS bound
  FROM n
)
SELECT {id}, set_config('idle_in_transaction_session_timeout', bound::text, true),
  set_config('` + fenceState + `', jsonb_build_object('base', base, 'set', bound, 'f', f)::text, true)
FROM b`)

// fenceIdleMargin is how much longer than its lock's time left a fenced
// transaction on PostgreSQL may idle before the server ends it (fenceSQL).
const fenceIdleMargin = time.Second

// fenceState is the setting, local to a transaction, in which fenceSQL
// keeps what the transaction's fence checks found. A custom setting needs
// a prefix: the module's own.
const fenceState = "cleveragents_locks.fences"

// maxIdleTimeout is the largest idle_in_transaction_session_timeout
// PostgreSQL takes, in milliseconds (INT_MAX): about 24 days.
const maxIdleTimeout = 1<<31 - 1
