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

// renewSQL is Renew's extension (application.DecideRenew) as one
// statement: a keep-alive renews every RenewInterval, and Update's
// transaction takes five round trips (BEGIN, the advisory lock, the read,
// the write, COMMIT) where this takes one. Parameters as acquireSQL's: $1
// the advisory lock key, $2 and $3 the resource, $4 the owner, $5 now and
// $6 the new expiry, both as stored. It returns the lock as extended, or
// no row when it extended nothing.
//
//   - held takes the resource's advisory lock first, as acquireSQL does:
//     an Update that took over the lock it found expired deletes the row
//     it read and inserts a new one, and must never meet this statement's
//     change in between (the delete would miss the renewed row, and the
//     insert would meet it as a unique violation).
//   - The WHERE is the whole rule for an extension: the row is owner's and
//     active at the time of the check, that is at now plus how long the
//     statement has been on the server (mostly waiting for the advisory
//     lock or for a row), as for acquireSQL's re-entry. A lock that was
//     active at now but has expired by the write is left alone: renewing
//     it would keep its token across a moment when it had lapsed.
//
// In READ COMMITTED the update finds the row in the statement's snapshot
// and, if a concurrent transaction changed it, waits for that one and tests
// its WHERE again on the row's latest version; a row deleted meanwhile (a
// release, a cleanup, a takeover) is not extended, and a row inserted after
// the snapshot is not seen. Both end in no row, and Update decides on the
// row as it is then. Every outcome but an extension (no lock, an expired
// one, another owner's) also ends in no row and writes nothing.
var renewSQL = pgStatement(`WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint))
UPDATE {locks} SET {expires} = $6::varchar
WHERE {type} = $2::varchar AND {rid} = $3::varchar AND {owner} = $4::varchar
  AND {expires} > to_char(($5::varchar::timestamptz + (clock_timestamp() - statement_timestamp())) AT TIME ZONE 'UTC', {layout})
  AND EXISTS (SELECT FROM held)
RETURNING {id}, {acquired}, {expires}`)

// renewTokenSQL is a handle's renewal (application.DecideRenewToken) as
// one statement: renewSQL whose WHERE names the acquisition too, $7 its
// token. A lock of the same owner with another token is another
// acquisition, and is never extended for this one.
var renewTokenSQL = strings.Replace(renewSQL, "AND EXISTS (SELECT FROM held)",
	"AND "+entlock.FieldID+" = $7::bigint AND EXISTS (SELECT FROM held)", 1)

// RenewTokenAt is a handle's renewal (application.OpRenewToken) with
// renewTokenSQL, as RenewAt does with renewSQL.
func (s *LockRepository) RenewTokenAt(ctx context.Context, ref domain.ResourceRef, owner string, token int64, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.renewWith(ctx, ref, owner, at, token)
}

// RenewAt is Renew's extension (application.OpRenew) with renewSQL: an
// Outcome of ChangeNone when it extended nothing. The lock written
// is dated now, read before the statement, so after a wait it has less
// than its TTL left; the service refuses one that has expired by the time
// the statement returns, as it does after every write.
func (s *LockRepository) RenewAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.renewWith(ctx, ref, owner, at, 0)
}

// renewWith runs renewSQL, or renewTokenSQL for a token other than 0, in
// a batch when others are in flight.
func (s *LockRepository) renewWith(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time), token int64) (application.Outcome, error) {
	now, expires := at()
	r := writeReq{key: resourceKey(ref), ref: ref, owner: owner, now: entstore.FormatTime(now), expires: entstore.FormatTime(expires), token: token}
	e, err := s.w.renew(ctx, r)
	l := domain.Lock{Token: e.token, Owner: owner, Resource: ref}
	if err == nil && e.extended {
		err = entstore.ParseTimes(&l, e.times[0], e.times[1])
	}
	if err != nil {
		return application.Outcome{}, s.Failed(ctx, err, "renew lock on", ref)
	}
	if !e.extended {
		return application.Outcome{}, nil
	}
	return application.Outcome{Kind: application.ChangeExtend, Lock: l}, nil
}
