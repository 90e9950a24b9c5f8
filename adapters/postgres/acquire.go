package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// pgStatement writes the schema's names into a statement of the package
// ({locks}, {id}, ...), and {layout}, the stored time format in to_char's
// terms.
var pgStatement = strings.NewReplacer(
	"{locks}", entlock.Table, "{id}", entlock.FieldID, "{owner}", entlock.FieldOwnerID,
	"{type}", entlock.FieldResourceType, "{rid}", entlock.FieldResourceID,
	"{acquired}", entlock.FieldAcquiredAt, "{expires}", entlock.FieldExpiresAt,
	"{serverNow}", `to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`,
	"{layout}", `'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'`,
	"{rowWait}", rowWaitSQL,
).Replace

// rowWait bounds how long acquireSQL and takeSQL wait for the row of an
// expired lock that another transaction holds: long enough for the
// writes that hold a lock row for a moment (a release, a renewal, a
// cleanup, a batch), far shorter than a fenced transaction, which holds
// its lock's row (FOR KEY SHARE) until it ends and may run on past the
// lock's expiry. Such a lock does not change hands while the transaction
// runs: a statement that waited for it held its caller, and every
// acquire queued behind it on the resource's advisory lock, for as long
// as the transaction ran, past any deadline but the caller's context.
// Past rowWait the statement fails (lock_not_available), writing
// nothing, and the acquire is refused with a conflict that names the
// holder and says that its row is held (lockNotAvailable).
const rowWait = 500 * time.Millisecond

// rowWaitSQL sets lock_timeout to rowWait for the rest of the statement's
// transaction, or leaves it as it is when it is shorter already (a role
// or a DSN that sets one).
var rowWaitSQL = fmt.Sprintf(`set_config('lock_timeout', CEIL(EXTRACT(EPOCH FROM LEAST(NULLIF(current_setting('lock_timeout')::interval, interval '0'), `+
	`interval '%d milliseconds')) * 1000)::bigint::text, true)`, rowWait.Milliseconds())

// serverNow reads the server's clock (clock_timestamp()) through q, in
// the stored time's precision.
func serverNow(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (time.Time, error) {
	var at string
	if err := q.QueryRowContext(ctx, serverNowSQL).Scan(&at); err != nil {
		return time.Time{}, err
	}
	t, err := entstore.ParseTime("clock_timestamp()", at)
	if err != nil {
		return time.Time{}, &domain.StoreError{Op: "read the server's time", Kind: domain.StoreCorrupt, Err: err}
	}
	return t, nil
}

var serverNowSQL = "SELECT " + pgStatement("{serverNow}")

// serverExpired is the condition that a lock row has expired on the
// server's clock.
var serverExpired = pgStatement("{expires} <= {serverNow}")

// pgStatements writes a statement that changes hands twice, as
// pgStatement does: [0] with {expiredOnServer} the test of the server's
// clock, [1] without it (Options.LocalTime).
func pgStatements(src string) [2]string {
	return [2]string{
		pgStatement(strings.ReplaceAll(src, "{expiredOnServer}", serverExpired)),
		pgStatement(strings.ReplaceAll(src, "{expiredOnServer}", "true")),
	}
}

// pick returns the version of a statement of pgStatements that this store
// runs.
func (s *LockRepository) pick(st [2]string) string {
	if s.localTime {
		return st[1]
	}
	return st[0]
}

// acquireFreeSQL acquires a free resource, the common case, in one
// statement that costs the server about what a plain insert does, and
// does nothing on a resource that has a row: acquireSQL then decides.
// Parameters as acquireSQL's; it returns the new lock's id and row
// version (its xmin, for undo), or no row.
//
// It takes the resource's advisory lock first, for the reason acquireSQL
// does. Its WHERE is the whole rule for this case: a resource with no row
// is free, whoever asks, and gets a new lock with a new id. The row is
// tested in the statement's snapshot, so that a resource that has one is
// left alone without drawing an id from the identity sequence (an insert
// that meets the unique index has already drawn one, and every 32nd draw
// is logged, which gives the statement a transaction id and its commit a
// WAL flush); a row committed after the snapshot (while the statement
// waited for the advisory lock) still meets the unique index, and ON
// CONFLICT DO NOTHING leaves it as it is, neither locked nor written.
//
// acquireSQL alone would do, but its three changes (delete, update,
// insert) cost the server their executor nodes even when only the insert
// has anything to do: about 50 µs of its CPU per call on the 2-vCPU
// machine of docs/performance.md, against about 10 µs for this one's
// test of the row.
var acquireFreeSQL = pgStatement(`WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint))
INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires})
SELECT $4::varchar, $2::varchar, $3::varchar, $5::varchar, $6::varchar
WHERE EXISTS (SELECT FROM held)
  AND NOT EXISTS (SELECT FROM {locks} WHERE {type} = $2 AND {rid} = $3)
ON CONFLICT ({type}, {rid}) DO NOTHING
RETURNING {id}, xmin::text`)

// acquireSQL is Acquire's rule (application.DecideAcquire) as one
// statement. Parameters: $1 the advisory lock key, $2 and $3 the resource,
// $4 the owner, $5 now and $6 the new expiry, both as stored.
//
//   - held takes the resource's transaction advisory lock first (each
//     change below waits for it in a one-time filter), so that the
//     statement and the Update transactions of the resource, this
//     version's and older ones', never interleave: an Update that read the
//     row and then inserts can never meet a row this statement inserted
//     meanwhile (a unique violation).
//   - bound sets lock_timeout to rowWait, once the advisory lock is held,
//     for old's wait for the row of an expired lock that another
//     transaction holds (a fenced one may hold it past the expiry).
//   - old deletes a lock that has expired at now, whoever held it: a
//     change of hands. It must have expired on the server's clock too
//     ({serverNow}, read when the row is tested): now is this host's
//     estimate of the server's time, which a link slower one way than the
//     other can put seconds ahead (ServerClock), and a lock must
//     never change hands before it has expired on the server.
//   - re extends the caller's own lock if it is still active: a re-entry
//     keeps the token and the acquisition time, and the later of the two
//     expiries (GREATEST: the stored times are fixed-width text in one
//     layout, whose order is the times' order). Active is checked at the
//     time of the check, not at now: now plus how long the statement has
//     been on the server (mostly waiting for the advisory lock or a row).
//     A lock that was active at now but has expired by the write is left
//     alone: no row comes back and Update decides (a re-entry after an
//     expiry is a change of hands, with a new token).
//   - ins inserts the new lock, with a new id from the identity sequence,
//     when nothing was extended and no row is left in the resource's
//     place (the row read by the statement's snapshot, unless old deleted
//     it): a refused attempt does not even draw from the sequence. A row
//     committed after the snapshot makes the insert do nothing
//     (ON CONFLICT DO NOTHING, which, unlike DO UPDATE ... WHERE, neither
//     locks nor writes the row it met).
//
// A refusal therefore changes nothing, takes no row lock and no
// transaction id, and its commit writes and flushes no WAL; its result is
// no row, and so is every case the statement leaves to Update.
//
// In READ COMMITTED, old and re find the row in the statement's snapshot
// and, if a concurrent transaction changed it, wait for that one and test
// their WHERE again on the row's latest version (a renewed lock is then
// no longer expired, and is spared); ins's conflict check sees committed
// rows whatever the snapshot. The first row says what happened: re-entered,
// or inserted with the lock it replaced, if any, and the inserted row's
// version (its xmin, for undo).
var acquireSQL = pgStatements(`WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint)),
bound AS MATERIALIZED (SELECT {rowWait} FROM held),
old AS (
  DELETE FROM {locks}
  WHERE {type} = $2::varchar AND {rid} = $3::varchar AND {expires} <= $5::varchar
    AND EXISTS (SELECT FROM bound) AND {expiredOnServer}
  RETURNING {id}, {owner}, {acquired}, {expires}),
re AS (
  UPDATE {locks} SET {expires} = GREATEST({expires}, $6::varchar)
  WHERE {type} = $2 AND {rid} = $3 AND {owner} = $4::varchar
    AND {expires} > to_char(($5::timestamptz + (clock_timestamp() - statement_timestamp())) AT TIME ZONE 'UTC', {layout})
    AND EXISTS (SELECT FROM held)
  RETURNING {id}, {acquired}, {expires}),
ins AS (
  INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires})
  SELECT $4, $2, $3, $5, $6
  WHERE EXISTS (SELECT FROM held) AND NOT EXISTS (SELECT FROM re)
    AND NOT EXISTS (SELECT FROM {locks} WHERE {type} = $2 AND {rid} = $3 AND {id} NOT IN (SELECT {id} FROM old))
  ON CONFLICT ({type}, {rid}) DO NOTHING
  RETURNING {id}, {acquired}, {expires}, xmin::text AS v)
SELECT true, {id}, {acquired}, {expires}, NULL::bigint, NULL::varchar, NULL::varchar, NULL::varchar, NULL::text FROM re
UNION ALL
SELECT false, ins.{id}, ins.{acquired}, ins.{expires}, old.{id}, old.{owner}, old.{acquired}, old.{expires}, ins.v
FROM ins LEFT JOIN old ON true`)

// takeSQL is Take's rule (application.DecideTake) as one statement:
// acquireSQL without its re-entry. An expired lock is replaced, whoever
// held it; an active one, the caller's own included, is left alone (no
// row comes back, and the read that follows names it). Parameters and
// result as acquireSQL's; the first column is always false.
var takeSQL = pgStatements(`WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint)),
bound AS MATERIALIZED (SELECT {rowWait} FROM held),
old AS (
  DELETE FROM {locks}
  WHERE {type} = $2::varchar AND {rid} = $3::varchar AND {expires} <= $5::varchar
    AND EXISTS (SELECT FROM bound) AND {expiredOnServer}
  RETURNING {id}, {owner}, {acquired}, {expires}),
ins AS (
  INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires})
  SELECT $4::varchar, $2, $3, $5, $6::varchar
  WHERE EXISTS (SELECT FROM held)
    AND NOT EXISTS (SELECT FROM {locks} WHERE {type} = $2 AND {rid} = $3 AND {id} NOT IN (SELECT {id} FROM old))
  ON CONFLICT ({type}, {rid}) DO NOTHING
  RETURNING {id}, {acquired}, {expires}, xmin::text AS v)
SELECT false, ins.{id}, ins.{acquired}, ins.{expires}, old.{id}, old.{owner}, old.{acquired}, old.{expires}, ins.v
FROM ins LEFT JOIN old ON true`)

// TakeAt is Take's rule (application.OpTake) as AcquireAt is Acquire's, with
// takeSQL: it never re-enters the caller's own active lock.
func (s *LockRepository) TakeAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.acquireBy(ctx, ref, owner, at, true, application.DecideTake)
}

// AcquireAt is Acquire's rule (application.OpAcquire) with acquireFreeSQL, then, if
// the resource has a row, acquireSQL.
//
// now was read before the statement, which may wait (for the resource's
// advisory lock, held by an Update, or for a row a release or a cleanup is
// deleting): every decision is then taken at an earlier now than the
// write's, and is never less safe for it. A takeover needs the old lock
// expired at now, so it is expired at the write too; a lock renewed while
// the statement waited is tested again on its new expiry and spared. A
// refusal at an earlier now is at worst early. A re-entry is checked
// against the time of the write (see acquireSQL). The lock written is dated
// now, so it may have less than its TTL left when the statement returns;
// the service refuses one that has expired by then (a LockExpiredError
// with WrittenAt), as it does after a slow commit.
//
// A refusal is first decided on a plain read when this process was just
// refused on ref (the Store's contention hint): one read instead of a
// statement and a read. When the statement changes nothing, the read that
// follows names the holder; if it shows no active lock of another owner
// (the holder released meanwhile, the caller's own lock expired during
// the wait), the decision goes to Update.
//
// acquireFreeSQL is skipped when a row is likely (the read just saw one,
// or this process holds the lock: occupied), where it would only cost a
// round trip; when it finds a row anyway, acquireSQL follows. Either way
// one statement decides, on the row as it is when that statement runs.
func (s *LockRepository) AcquireAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.acquireBy(ctx, ref, owner, at, false, application.DecideAcquire)
}

// acquireBy is AcquireAt with acquireSQL, or with takeSQL (take), and the
// rule it carries out, decide, for the refusals it reads.
func (s *LockRepository) acquireBy(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time), take bool,
	decide func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (application.Change, error)) (application.Outcome, error) {
	now, expires := at()
	seen := false // a row was read just now
	if s.Contended().Has(ref) {
		var err error
		if seen, err = s.refusal(ctx, ref, owner, now, expires, decide); err != nil {
			return application.Outcome{}, err
		}
	}
	acquired, until := entstore.FormatTime(now), entstore.FormatTime(expires)
	if !seen && !s.occupied.Has(ref) {
		a, ok, err := s.acquireFree(ctx, ref, owner, acquired, until)
		if err != nil || ok {
			return a, err
		}
	}
	req := writeReq{key: resourceKey(ref), ref: ref, owner: owner, now: acquired, expires: until, take: take}
	m, err := s.w.acquire(ctx, req)
	for again := 0; ; again++ {
		if err != nil {
			if held := s.rowHeld(ctx, err, ref, owner, now, expires, decide); held != nil {
				return application.Outcome{}, held
			}
			return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
		}
		if m.decided {
			s.Contended().Note(ref, false)
			s.occupied.Note(ref, true)
			return m.a, nil
		}
		if err := s.refusalOnServer(ctx, ref, owner, now, expires, decide); err != nil {
			return application.Outcome{}, err
		}
		if again == undecidedAgain {
			return application.Outcome{}, nil
		}
		// Nothing refuses the caller now: the lock that the statement met
		// was released since, or it expired while the statement waited.
		// The statement decides again, on its own and at a new now, as
		// Update would, rather than Update at once: a lone statement
		// whose caller leaves is undone (runOne), an Update cut in its
		// commit is not.
		now, expires = at()
		req.now, req.expires = entstore.FormatTime(now), entstore.FormatTime(expires)
		m, err = s.w.acquireAlone(ctx, req)
	}
}

// undecidedAgain is how often an acquire that its statement left
// undecided, with nothing refusing it, runs the statement again before
// Update decides: a lock released between the statement and the read
// leaves it so, and its next run decides.
const undecidedAgain = 2

// refusalOnServer explains a statement that left the resource alone: the
// lock that refuses the caller, if one does. A lock that has expired at
// now but not yet on the server's clock refuses it too: the statement
// tested both (old, in acquireSQL), and Update, which decides on now
// alone, must not take over what the statement would not. now is this
// host's estimate of the server's time, which a link slower one way than
// the other can put seconds ahead; the server's clock is read only then.
func (s *LockRepository) refusalOnServer(ctx context.Context, ref domain.ResourceRef, owner string, now, expires time.Time,
	decide func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (application.Change, error)) error {
	cur, err := s.ReadLock(ctx, ref)
	if err != nil {
		return s.explain(ctx, err, "read lock on "+ref.String())
	}
	_, err = decide(cur, owner, ref, now, expires)
	if err == nil && cur != nil && cur.ExpiredAt(now) && !s.localTime {
		server, serr := serverNow(ctx, s.db)
		if serr != nil {
			return s.explain(ctx, serr, "read the server's time")
		}
		if !cur.ExpiredAt(server) {
			_, err = decide(cur, owner, ref, server, expires)
		}
	}
	if errors.Is(err, domain.ErrConflict) {
		s.Contended().Note(ref, true)
		return err
	}
	return nil
}

// rowHeld explains an acquire statement that could not have the row of
// the lock it met within rowWait (lockNotAvailable): the lock as
// it is now, read outside the statement, refuses the caller (it was
// renewed meanwhile, or is another owner's and active), or it has expired
// and its row is held by another transaction, most likely the holder's
// fenced one, which the lock does not change hands before: a conflict
// either way, which a waiting caller waits on. It returns nil when
// neither holds (the lock is gone, or the wait was for something else,
// such as the advisory lock under a lock_timeout of the caller's role):
// the statement's error then stands.
func (s *LockRepository) rowHeld(ctx context.Context, err error, ref domain.ResourceRef, owner string, now, expires time.Time,
	decide func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (application.Change, error)) error {
	if !lockNotAvailable(err) || ctx.Err() != nil {
		return nil
	}
	cur, rerr := s.ReadLock(ctx, ref)
	if rerr != nil || cur == nil {
		return nil
	}
	if _, derr := decide(cur, owner, ref, now, expires); errors.Is(derr, domain.ErrConflict) {
		s.Contended().Note(ref, true)
		return derr
	}
	if !cur.ExpiredAt(now) {
		return nil
	}
	s.Contended().Note(ref, true)
	return &domain.LockConflictError{Holder: *cur, Now: now, RowHeld: true}
}

// acquireFree runs acquireFreeSQL; ok says whether it inserted the lock.
func (s *LockRepository) acquireFree(ctx context.Context, ref domain.ResourceRef, owner, acquired, expires string) (application.Outcome, bool, error) {
	in, err := s.w.free(ctx, writeReq{key: resourceKey(ref), ref: ref, owner: owner, now: acquired, expires: expires})
	var a application.Outcome
	if err == nil && in.ok {
		a.Kind, a.Lock = application.ChangeInsert, domain.Lock{Token: in.token, Owner: owner, Resource: ref}
		err = entstore.ParseTimes(&a.Lock, acquired, expires)
	}
	if err != nil {
		return application.Outcome{}, false, s.Failed(ctx, err, "acquire lock on", ref)
	}
	if in.ok {
		s.Contended().Note(ref, false)
		s.occupied.Note(ref, true)
	}
	return a, in.ok, nil
}

// refusal reads the lock on ref and returns decide's conflict (Acquire's:
// another owner's lock, stored and active at now; Take's: any active
// lock) if it refuses owner; nil otherwise. found says whether the read
// saw a row.
func (s *LockRepository) refusal(ctx context.Context, ref domain.ResourceRef, owner string, now, expires time.Time,
	decide func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (application.Change, error)) (found bool, err error) {
	cur, err := s.ReadLock(ctx, ref)
	if err != nil {
		return false, s.explain(ctx, err, "read lock on "+ref.String())
	}
	_, err = decide(cur, owner, ref, now, expires)
	if errors.Is(err, domain.ErrConflict) {
		s.Contended().Note(ref, true)
		return true, err
	}
	return cur != nil, nil
}
