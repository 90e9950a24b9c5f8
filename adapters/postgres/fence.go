package postgres

import (
	"context"
	"fmt"
	"time"

	"entgo.io/ent/dialect"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
)

// CheckFence is Container.CheckFence's check on PostgreSQL, in the caller's
// transaction q (entstore.CheckFence): it holds the row FOR KEY SHARE until
// q ends, which a release, takeover or cleanup waits for but a renewal does
// not, and bounds q's idle time (fenceSQL). Run q at READ COMMITTED.
// Errors: those of entstore.CheckFence, and *domain.StaleSnapshotError for a
// q above READ COMMITTED whose snapshot does not show the lock held.
func CheckFence(ctx context.Context, q entstore.Querier, f application.Fence, now time.Time) error {
	if err := entstore.CheckFence(ctx, q, dialect.Postgres, f, now, fenceHolds); err != nil {
		return snapshotMayBeOld(ctx, q, f, err)
	}
	return nil
}

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

// fenceSQL is the check: the lock row FOR KEY SHARE if it is the fence's
// and active at now ($1 token, $2 owner, $3 and $4 resource, $5 now). A
// stopped client would hold the row for hours of TCP keepalives: so it
// sets idle_in_transaction_session_timeout to the shortest time left of
// the transaction's fences plus fenceIdleMargin, at most its own timeout.
// fenceState keeps each fence's expiry, the timeout before the first check
// ("base") and the bound set ("set"; another is the transaction's own).
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

// fenceIdleMargin is how much longer than its lock a fence may idle.
const fenceIdleMargin = time.Second

// fenceState is the transaction's setting where fenceSQL keeps what its
// checks found (a custom setting needs a prefix).
const fenceState = "cleveragents_locks.fences"

// maxIdleTimeout is the largest idle_in_transaction_session_timeout
// PostgreSQL takes, in milliseconds (INT_MAX): about 24 days.
const maxIdleTimeout = 1<<31 - 1
