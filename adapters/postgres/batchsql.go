package postgres

import "strings"

// The batch statements of group commit (batch.go): each is the statement
// of one write (acquireFreeSQL, acquireSQL, takeSQL, renewSQL and
// renewTokenSQL, the releases) over arrays, one element per member, with
// that statement's WHERE for each member's row. req numbers the members
// (n, from 1); a batch holds one member per resource. Each statement
// returns a row for every member it decided, named by n (or, where a
// RETURNING cannot name it, by its resource). A member it does not name
// is told the outcome that is always safe to act on: nothing inserted (the
// acquire goes on to acquireSQL), nothing decided (the acquire runs its
// own statement, waiting as it always did: acquireMany), nothing extended
// (Update decides), nothing removed (the lock was not there, or not the
// caller's).
//
// No batch waits for a lock, so that no member waits for another's
// resource:
//   - The advisory lock of each member's resource is taken with
//     pg_try_advisory_xact_lock, which never waits: a member whose lock is
//     held (an Update transaction, a lone statement, another batch) is not
//     decided. A release takes none, as alone.
//   - The rows a batch would change (a takeover's, a re-entry's, a
//     renewal's, a release's) are locked first, SKIP LOCKED: a row that
//     a fence, another write or a release of all an owner's locks holds
//     leaves its member undecided (the acquires: their own statement) or busy
//     (renewals and releases: the caller runs its own statement), and
//     either way it then waits as it always did, on its own.
//
// Every row is found through the resource's unique index, one lookup per
// member (rows, a LATERAL subquery with LIMIT 1, which the planner cannot
// turn into a join), and locked through the primary key the same way
// (lockRows). A plan that scanned the table and hashed it, which the
// planner picks when it cannot see how few members a batch has and the
// table was never analyzed, would cost the server a read of every row,
// dead or alive, per batch. The changes find their rows by id (id = ANY),
// where only the PostgreSQL adapter's connections (enable_seqscan off)
// keep the planner from a scan.

// batchRows finds the row of each member of req in the statement's
// snapshot: (id, owner, expires, n). The statements decide on these
// columns rather than read the table again by id, which the planner,
// when the table's statistics say it is small, does with a scan.
const batchRows = `rows AS MATERIALIZED (SELECT x.{id}, x.{owner}, x.{expires}, req.n FROM req,
  LATERAL (SELECT l.{id}, l.{owner}, l.{expires} FROM {locks} l WHERE l.{type} = req.typ AND l.{rid} = req.rid LIMIT 1) x)`

// lockRows locks the rows of the CTE from (id, n) in mode (FOR UPDATE,
// FOR NO KEY UPDATE) SKIP LOCKED, one lookup of the primary key per row,
// and names the CTE as: (id, n). The statement's change then finds each
// row by its id, as the statement's snapshot saw it, and PostgreSQL
// follows a row changed since to its newest version, on which the change
// decides again (READ COMMITTED). It must not reach the row through the
// version that the lock returns (its ctid): that version may be newer
// than the snapshot, which then cannot see it, and the change would pass
// over a row that is there.
func lockRows(as, from, mode string) string {
	return as + ` AS MATERIALIZED (SELECT x.{id}, ` + from + `.n FROM ` + from + `,
  LATERAL (SELECT l.{id} FROM {locks} l WHERE l.{id} = ` + from + `.{id} ` + mode + ` SKIP LOCKED) x)`
}

// noRow is the condition that the member r's resource has no row in the
// statement's snapshot, tested through the unique index.
const noRow = `(SELECT l.{id} FROM {locks} l WHERE l.{type} = r.typ AND l.{rid} = r.rid) IS NULL`

// acquireFreeBatchSQL is acquireFreeSQL over arrays: it inserts the lock
// of every member whose resource has no row and whose advisory lock it
// gets. Result: a row per lock inserted, n and its id.
var acquireFreeBatchSQL = pgStatement(`WITH ins AS (
  INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires})
  SELECT own, typ, rid, acq, exp
  FROM unnest($1::bigint[], $2::varchar[], $3::varchar[], $4::varchar[], $5::varchar[], $6::varchar[]) AS r(k, typ, rid, own, acq, exp)
  WHERE ` + noRow + ` AND pg_try_advisory_xact_lock(k)
  ON CONFLICT ({type}, {rid}) DO NOTHING
  RETURNING {id}, {type}, {rid}, xmin::text AS v)
SELECT r.n, ins.{id}, ins.v FROM ins JOIN unnest($2::varchar[], $3::varchar[]) WITH ORDINALITY AS r(typ, rid, n)
  ON ins.{type} = r.typ AND ins.{rid} = r.rid`)

// acquireBatchSQL is acquireSQL over arrays; takeBatchSQL is takeSQL's
// (no re-entry). held are the members whose advisory lock the statement
// got; cand the rows it may change (expired at now, or for a re-entry the
// caller's own), as its snapshot sees them: an active lock of another
// owner is neither changed nor locked; cur the candidates it locked; ok
// the members it decides: held, with their candidate locked or none. Result: per member decided, n and
// acquireSQL's row, whose id is NULL where the statement changed nothing.
var acquireBatchSQL, takeBatchSQL = acquireBatch(true), acquireBatch(false)

func acquireBatch(reenter bool) [2]string {
	re := `re AS (
  UPDATE {locks} l SET {expires} = GREATEST(l.{expires}, req.exp) FROM req, cur
  WHERE l.{id} = ANY (ARRAY(SELECT {id} FROM cur)) AND l.{id} = cur.{id} AND cur.n = req.n AND l.{owner} = req.own
    AND l.{expires} > to_char((req.acq::timestamptz + (clock_timestamp() - statement_timestamp())) AT TIME ZONE 'UTC', {layout})
  RETURNING req.n, l.{id}, l.{acquired}, l.{expires}),`
	changes := "l.{expires} <= req.acq OR l.{owner} = req.own" // the rows old or re may change
	if !reenter {
		re = `re AS (SELECT 0::bigint AS n, 0::bigint AS {id}, ''::varchar AS {acquired}, ''::varchar AS {expires} WHERE false),`
		changes = "l.{expires} <= req.acq"
	}
	return pgStatements(`WITH req AS (SELECT * FROM unnest($1::bigint[], $2::varchar[], $3::varchar[], $4::varchar[], $5::varchar[], $6::varchar[])
  WITH ORDINALITY AS r(k, typ, rid, own, acq, exp, n)),
held AS MATERIALIZED (SELECT n FROM req WHERE pg_try_advisory_xact_lock(k)),
` + batchRows + `,
cand AS MATERIALIZED (SELECT l.{id}, n FROM rows l JOIN req USING (n)
  WHERE n IN (SELECT n FROM held) AND (` + changes + `)),
` + lockRows("cur", "cand", "FOR UPDATE") + `,
ok AS MATERIALIZED (SELECT n FROM held WHERE n IN (SELECT n FROM cur) OR n NOT IN (SELECT n FROM cand)),
old AS (
  DELETE FROM {locks} l USING req, cur
  WHERE l.{id} = ANY (ARRAY(SELECT {id} FROM cur)) AND l.{id} = cur.{id} AND cur.n = req.n
    AND l.{expires} <= req.acq AND {expiredOnServer}
  RETURNING req.n, l.{id}, l.{owner}, l.{acquired}, l.{expires}),
` + re + `
ins AS (
  INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires})
  SELECT own, typ, rid, acq, exp FROM req r
  WHERE n IN (SELECT n FROM ok) AND n NOT IN (SELECT n FROM re)
    AND n NOT IN (SELECT n FROM rows WHERE {id} NOT IN (SELECT {id} FROM old))
  ON CONFLICT ({type}, {rid}) DO NOTHING
  RETURNING {id}, {type}, {rid}, {acquired}, {expires}, xmin::text AS v)
SELECT ok.n, re.n IS NOT NULL, COALESCE(re.{id}, ins.{id}), COALESCE(re.{acquired}, ins.{acquired}), COALESCE(re.{expires}, ins.{expires}),
  CASE WHEN ins.{id} IS NOT NULL THEN old.{id} END, old.{owner}, old.{acquired}, old.{expires}, ins.v
FROM ok JOIN req USING (n) LEFT JOIN re USING (n)
  LEFT JOIN ins ON ins.{type} = req.typ AND ins.{rid} = req.rid LEFT JOIN old ON old.n = req.n`)
}

// renewBatchSQL is renewSQL and renewTokenSQL over arrays: tok is the
// member's token, or 0 for a renewal by owner. mine are the rows it would
// extend, as its snapshot sees them; it locks them FOR NO KEY UPDATE (which
// a fence's FOR KEY SHARE lets through) SKIP LOCKED: a row that another
// write holds (a release of all an owner's locks holds each row it deleted
// until it ends, and may wait long for a fence on another) would otherwise
// keep the whole batch, and the advisory locks it took, waiting. Result: a
// row per member decided, n, false and the lock as extended (NULLs when
// nothing was extended), or n and true for a member whose row was busy,
// which runs its own statement (and waits, as alone).
var renewBatchSQL = pgStatement(`WITH req AS (SELECT * FROM unnest($1::bigint[], $2::varchar[], $3::varchar[], $4::varchar[], $5::varchar[], $6::varchar[], $7::bigint[])
  WITH ORDINALITY AS r(k, typ, rid, own, acq, exp, tok, n)),
held AS MATERIALIZED (SELECT n FROM req WHERE pg_try_advisory_xact_lock(k)),
` + batchRows + `,
mine AS MATERIALIZED (SELECT l.{id}, n FROM rows l JOIN req USING (n)
  WHERE n IN (SELECT n FROM held) AND l.{owner} = req.own AND (req.tok = 0 OR l.{id} = req.tok)),
` + lockRows("cur", "mine", "FOR NO KEY UPDATE") + `,
up AS (
  UPDATE {locks} l SET {expires} = req.exp FROM req, cur
  WHERE l.{id} = ANY (ARRAY(SELECT {id} FROM cur)) AND l.{id} = cur.{id} AND cur.n = req.n
    AND l.{type} = req.typ AND l.{rid} = req.rid AND l.{owner} = req.own AND (req.tok = 0 OR l.{id} = req.tok)
    AND l.{expires} > to_char((req.acq::timestamptz + (clock_timestamp() - statement_timestamp())) AT TIME ZONE 'UTC', {layout})
  RETURNING req.n, l.{id}, l.{acquired}, l.{expires})
SELECT n, false, {id}, {acquired}, {expires} FROM up
UNION ALL
SELECT n, true, NULL, NULL, NULL FROM mine WHERE n NOT IN (SELECT n FROM cur)`)

// releaseBatchSQL is the releases by owner (tok 0) and by token (active at
// at) over arrays, with the wake-up of each lock removed ({notice}) and
// the backend's setting of the commit ({commit}). The
// rows a member would remove are locked first, SKIP LOCKED: a lock that a
// fenced transaction holds (FOR KEY SHARE, for as long as its holder's
// transaction lasts) would otherwise keep the whole batch waiting. Result:
// a row per member decided, n and false, or n and true for a member whose
// row was busy, which runs its own statement (and waits, as alone).
var releaseBatchSQL = pgStatement(`WITH req AS (SELECT * FROM unnest($1::varchar[], $2::varchar[], $3::varchar[], $4::bigint[], $5::varchar[])
  WITH ORDINALITY AS r(typ, rid, own, tok, at, n)),
` + batchRows + `,
mine AS MATERIALIZED (SELECT l.{id}, n FROM rows l JOIN req USING (n)
  WHERE CASE WHEN req.tok = 0 THEN l.{owner} = req.own ELSE l.{id} = req.tok AND l.{expires} > req.at END),
` + lockRows("cur", "mine", "FOR UPDATE") + `,
d AS (
  DELETE FROM {locks} l USING req, cur
  WHERE l.{id} = ANY (ARRAY(SELECT {id} FROM cur)) AND l.{id} = cur.{id} AND cur.n = req.n
    AND l.{type} = req.typ AND l.{rid} = req.rid
    AND CASE WHEN req.tok = 0 THEN l.{owner} = req.own ELSE l.{id} = req.tok AND l.{expires} > req.at END
  RETURNING req.n, l.{type}, l.{rid}),
w AS MATERIALIZED (SELECT n, {notice} AS sent, {commit} AS committed FROM d)
SELECT n, false FROM w
UNION ALL
SELECT n, true FROM mine WHERE n NOT IN (SELECT n FROM cur)`)

// releaseBatch writes notice, the backend's wake-up of the lock removed
// from the resource d.typ, d.rid (nil: none), and commit, its setting of
// the commit (empty: none), into releaseBatchSQL.
func releaseBatch(notice func(typ, id string) string, commit string) string {
	expr := "NULL"
	if notice != nil {
		expr = notice("d.{type}", "d.{rid}")
	}
	if commit == "" {
		commit = "NULL"
	}
	return strings.NewReplacer("{notice}", pgStatement(expr), "{commit}", commit).Replace(releaseBatchSQL)
}
