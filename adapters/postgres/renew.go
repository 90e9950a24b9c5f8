package postgres

import (
	"context"
	"strings"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// renewSQL is Renew's extension (application.DecideRenew) in one round
// trip, parameters as acquireSQL's, returning the server's clock too; no
// row: nothing written. held comes
// first, so that an Update's takeover never meets this change half-way.
var renewSQL = pgStatement(`WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint))
UPDATE {locks} SET {expires} = $6::varchar
WHERE {type} = $2::varchar AND {rid} = $3::varchar AND {owner} = $4::varchar
  AND ` + activeAtCheck("{expires}", "$5::varchar") + `
  AND EXISTS (SELECT FROM held)
RETURNING {id}, {acquired}, {expires}, {note}, clock_timestamp()`)

// renewTokenSQL is a handle's renewal (application.DecideRenewToken):
// renewSQL for the acquisition $7 only.
var renewTokenSQL = strings.Replace(renewSQL, "AND EXISTS (SELECT FROM held)",
	"AND "+entlock.FieldID+" = $7::bigint AND EXISTS (SELECT FROM held)", 1)

// RenewTokenAt is a handle's renewal (application.OpRenewToken) with
// renewTokenSQL, as RenewAt does with renewSQL.
func (s *LockRepository) RenewTokenAt(ctx context.Context, ref domain.ResourceRef, owner string, token int64, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.renewWith(ctx, ref, owner, at, token)
}

// RenewAt is Renew's extension (application.OpRenew) with renewSQL: an
// Outcome of ChangeNone when it extended nothing.
func (s *LockRepository) RenewAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.renewWith(ctx, ref, owner, at, 0)
}

// renewWith runs renewSQL, or renewTokenSQL for a token other than 0.
func (s *LockRepository) renewWith(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time), token int64) (application.Outcome, error) {
	now, expires := at()
	m, err := s.w.renew(ctx, writeReq{key: resourceKey(ref), ref: ref, owner: owner, now: entstore.FormatTime(now), expires: entstore.FormatTime(expires), token: token})
	var a application.Outcome
	if err == nil && m.id.Valid {
		m.reentered = true // an extension
		a, err = m.outcome(ref, owner)
	}
	if err != nil {
		return application.Outcome{}, s.Failed(ctx, err, "renew lock on", ref)
	}
	return a, nil
}
