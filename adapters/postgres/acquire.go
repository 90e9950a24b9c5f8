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

// pgStatement writes the schema's names into a statement ({locks}, {id},
// ...), and {layout}, the stored time format in to_char's terms.
var pgStatement = strings.NewReplacer(
	"{locks}", entlock.Table, "{id}", entlock.FieldID, "{owner}", entlock.FieldOwnerID,
	"{type}", entlock.FieldResourceType, "{rid}", entlock.FieldResourceID,
	"{acquired}", entlock.FieldAcquiredAt, "{expires}", entlock.FieldExpiresAt, "{note}", entlock.FieldNote,
	"{serverNow}", `to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`,
	"{layout}", `'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'`,
	"{rowWait}", rowWaitSQL,
).Replace

// rowWait bounds an acquire's wait for an expired lock's row: longer than
// a write holds one, far shorter than a fenced transaction may, holding up
// every acquire queued on the advisory lock. Past it, rowHeld refuses.
const rowWait = 500 * time.Millisecond

// rowWaitSQL sets lock_timeout to rowWait unless a shorter one is set.
var rowWaitSQL = fmt.Sprintf(`set_config('lock_timeout', CEIL(EXTRACT(EPOCH FROM LEAST(NULLIF(current_setting('lock_timeout')::interval, interval '0'), `+
	`interval '%d milliseconds')) * 1000)::bigint::text, true)`, rowWait.Milliseconds())

// activeAtCheck tests a row active at now plus the statement's time on
// the server: extending a lock that lapsed while the statement waited
// would keep its token across the lapse.
func activeAtCheck(expires, now string) string {
	return expires + ` > to_char((` + now + `::timestamptz + (clock_timestamp() - statement_timestamp())) AT TIME ZONE 'UTC', {layout})`
}

// serverNow reads the server's clock through q, in the stored precision.
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

var (
	serverNowSQL  = "SELECT " + pgStatement("{serverNow}")
	serverExpired = pgStatement("{expires} <= {serverNow}")
)

// pgStatements writes src as pgStatement does, [0] with {expiredOnServer}
// the server clock's test, [1] without it (Options.LocalTime).
func pgStatements(src string) [2]string {
	return [2]string{
		pgStatement(strings.ReplaceAll(src, "{expiredOnServer}", serverExpired)),
		pgStatement(strings.ReplaceAll(src, "{expiredOnServer}", "true")),
	}
}

// pick returns the version of a statement of pgStatements this store runs.
func (s *LockRepository) pick(st [2]string) string {
	if s.localTime {
		return st[1]
	}
	return st[0]
}

// acquireFreeSQL inserts the lock of a resource with no row, the common case,
// for a fifth of acquireSQL's server CPU; parameters as acquireSQL's. Testing
// the snapshot first keeps an occupied resource from drawing an id.
var acquireFreeSQL = pgStatement(`WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint))
INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires}, {note})
SELECT $4::varchar, $2::varchar, $3::varchar, $5::varchar, $6::varchar, NULLIF($7::varchar, '')
WHERE EXISTS (SELECT FROM held)
  AND NOT EXISTS (SELECT FROM {locks} WHERE {type} = $2 AND {rid} = $3)
ON CONFLICT ({type}, {rid}) DO NOTHING
RETURNING {id}, xmin::text, clock_timestamp()`)

// acquireSQL is Acquire's rule (application.DecideAcquire) as one
// statement; takeSQL is Take's, without re-entry. Parameters: $1 the
// advisory lock key, $2 and $3 the resource, $4 the owner, $5 now, $6
// the new expiry and $7 the note (empty: none); each also returns the
// server's clock (ServerClock.observe). held comes first, so that
// an Update that read the row never meets this insert; old needs the lock
// expired on the server's clock too, as now is an estimate. ins draws no id on a refusal; it writes nothing.
var acquireSQL, takeSQL = acquireStatement(true), acquireStatement(false)

func acquireStatement(reenter bool) [2]string {
	re, notRe, reRow := "", "", ""
	if reenter {
		re = `
re AS (
  UPDATE {locks} SET {expires} = GREATEST({expires}, $6::varchar)
  WHERE {type} = $2 AND {rid} = $3 AND {owner} = $4::varchar
    AND ` + activeAtCheck("{expires}", "$5") + `
    AND EXISTS (SELECT FROM held)
  RETURNING {id}, {acquired}, {expires}, {note}),`
		notRe = " AND NOT EXISTS (SELECT FROM re)"
		reRow = `SELECT true, {id}, {acquired}, {expires}, NULL::bigint, NULL::varchar, NULL::varchar, NULL::varchar, NULL::text, {note}, NULL::varchar, clock_timestamp() FROM re
UNION ALL
`
	}
	return pgStatements(`WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock($1::bigint)),
bound AS MATERIALIZED (SELECT {rowWait} FROM held),
old AS (
  DELETE FROM {locks}
  WHERE {type} = $2::varchar AND {rid} = $3::varchar AND {expires} <= $5::varchar
    AND EXISTS (SELECT FROM bound) AND {expiredOnServer}
  RETURNING {id}, {owner}, {acquired}, {expires}, {note}),` + re + `
ins AS (
  INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires}, {note})
  SELECT $4::varchar, $2, $3, $5, $6::varchar, NULLIF($7::varchar, '')
  WHERE EXISTS (SELECT FROM held)` + notRe + `
    AND NOT EXISTS (SELECT FROM {locks} WHERE {type} = $2 AND {rid} = $3 AND {id} NOT IN (SELECT {id} FROM old))
  ON CONFLICT ({type}, {rid}) DO NOTHING
  RETURNING {id}, {acquired}, {expires}, {note}, xmin::text AS v)
` + reRow + `SELECT false, ins.{id}, ins.{acquired}, ins.{expires}, old.{id}, old.{owner}, old.{acquired}, old.{expires}, ins.v, ins.{note}, old.{note}, clock_timestamp()
FROM ins LEFT JOIN old ON true`)
}

// TakeAt is Take's rule (application.OpTake) as AcquireAt is Acquire's,
// with takeSQL: it never re-enters the caller's own active lock.
func (s *LockRepository) TakeAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.acquireBy(ctx, ref, owner, "", at, true, application.DecideTake)
}

// AcquireAt is Acquire's rule (application.OpAcquire) with acquireFreeSQL,
// then, if the resource has a row, acquireSQL; right after a refusal on ref
// a plain read decides first. A now read before the statement is never less safe.
func (s *LockRepository) AcquireAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.acquireBy(ctx, ref, owner, "", at, false, application.DecideAcquire)
}

// acquireBy is AcquireAt, or TakeAt (take), storing note with a new lock, with decide's refusals.
func (s *LockRepository) acquireBy(ctx context.Context, ref domain.ResourceRef, owner, note string, at func() (time.Time, time.Time), take bool,
	decide func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (application.Change, error)) (application.Outcome, error) {
	now, expires := at()
	refuses := func(cur *domain.Lock, now time.Time) error {
		_, err := decide(cur, owner, ref, now, expires)
		return err
	}
	decided := func(m made) (application.Outcome, error) {
		a, err := m.outcome(ref, owner)
		if err != nil {
			return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
		}
		s.Contended().Note(ref, false)
		s.occupied.Note(ref, true)
		if a.Previous != nil && s.replaced != nil {
			s.replaced(ctx, ref) // its holder may not know yet
		}
		return a, nil
	}
	seen := false // a row was read just now
	if s.Contended().Has(ref) {
		var err error
		if seen, err = s.refusal(ctx, ref, now, refuses, false); err != nil {
			return application.Outcome{}, err
		}
	}
	req := writeReq{key: resourceKey(ref), ref: ref, owner: owner, now: entstore.FormatTime(now), expires: entstore.FormatTime(expires), take: take, note: note}
	if !seen && !s.occupied.Has(ref) {
		m, err := s.w.free(ctx, req)
		if err != nil {
			return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
		}
		if m.id.Valid {
			m.times = [2]sql.NullString{{String: req.now, Valid: true}, {String: req.expires, Valid: true}}
			m.note = entstore.NoteValue(note)
			return decided(m)
		}
	}
	m, err := s.w.acquire(ctx, req)
	for again := 0; ; again++ {
		if err != nil {
			if held := s.rowHeld(ctx, err, ref, now, refuses); held != nil {
				return application.Outcome{}, held
			}
			return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
		}
		if m.id.Valid {
			return decided(m)
		}
		if _, err := s.refusal(ctx, ref, now, refuses, true); err != nil {
			return application.Outcome{}, err
		}
		if again == undecidedAgain {
			return application.Outcome{}, nil // Update decides
		}
		// The lock met is gone or expired: decide again alone, rather than
		// Update, since a lone statement whose caller leaves is undone.
		now, expires = at()
		req.now, req.expires = entstore.FormatTime(now), entstore.FormatTime(expires)
		m, err = s.w.acquireAlone(ctx, req)
	}
}

// undecidedAgain is how often an acquire left undecided runs again.
const undecidedAgain = 2

// refusal reads the lock on ref and returns the conflict refuses finds at
// now, if any; found says whether a row was read. onServer: a lock expired
// at now but not on the server's clock refuses too, as in the statement.
func (s *LockRepository) refusal(ctx context.Context, ref domain.ResourceRef, now time.Time, refuses func(*domain.Lock, time.Time) error, onServer bool) (found bool, err error) {
	cur, err := s.ReadLock(ctx, ref)
	if err != nil {
		return false, s.explain(ctx, err, "read lock on "+ref.String())
	}
	err = refuses(cur, now)
	if onServer && err == nil && cur != nil && cur.ExpiredAt(now) && !s.localTime {
		server, serr := serverNow(ctx, s.db)
		if serr != nil {
			return true, s.explain(ctx, serr, "read the server's time")
		}
		if !cur.ExpiredAt(server) {
			err = refuses(cur, server)
		}
	}
	if errors.Is(err, domain.ErrConflict) {
		s.Contended().Note(ref, true)
		return true, err
	}
	return cur != nil, nil
}

// rowHeld explains a statement that waited rowWait in vain: a conflict if
// the lock, read again, refuses the caller or has expired with its row
// held (a fenced transaction); nil, leaving the error, otherwise.
func (s *LockRepository) rowHeld(ctx context.Context, err error, ref domain.ResourceRef, now time.Time, refuses func(*domain.Lock, time.Time) error) error {
	if !lockNotAvailable(err) || ctx.Err() != nil {
		return nil
	}
	cur, rerr := s.ReadLock(ctx, ref)
	if rerr != nil || cur == nil {
		return nil
	}
	conflict := refuses(cur, now)
	if !errors.Is(conflict, domain.ErrConflict) {
		if !cur.ExpiredAt(now) {
			return nil
		}
		conflict = &domain.LockConflictError{Holder: *cur, Now: now, RowHeld: true}
	}
	s.Contended().Note(ref, true)
	return conflict
}
