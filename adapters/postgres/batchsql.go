package postgres

import "strings"

// The batch statements of group commit: a lone write's statement over
// arrays, one element per member (n, from 1). No batch waits for a lock
// (pg_try_advisory_xact_lock, SKIP LOCKED): a busy member runs alone.
// LATERAL ... LIMIT 1 keeps one index lookup per member, where the planner
// would hash-scan a never analyzed table.

// batchRows is each member's row in the snapshot: (id, owner, expires, n).
const batchRows = `rows AS MATERIALIZED (SELECT x.{id}, x.{owner}, x.{expires}, req.n FROM req,
  LATERAL (SELECT l.{id}, l.{owner}, l.{expires} FROM {locks} l WHERE l.{type} = req.typ AND l.{rid} = req.rid LIMIT 1) x)`

// lockRows is the CTE as (id, n): the rows of from locked in mode, SKIP
// LOCKED, by primary key. The change then finds each by id, not by the
// lock's ctid, which may be newer than the snapshot and would be missed.
func lockRows(as, from, mode string) string {
	return as + ` AS MATERIALIZED (SELECT x.{id}, ` + from + `.n FROM ` + from + `,
  LATERAL (SELECT l.{id} FROM {locks} l WHERE l.{id} = ` + from + `.{id} ` + mode + ` SKIP LOCKED) x)`
}

// noRow: the member r's resource has no row in the statement's snapshot.
const noRow = `(SELECT l.{id} FROM {locks} l WHERE l.{type} = r.typ AND l.{rid} = r.rid) IS NULL`

// acquireFreeBatchSQL is acquireFreeSQL over arrays. Result: per lock inserted, n, its id, xmin and the server's time.
var acquireFreeBatchSQL = pgStatement(`WITH ins AS (
  INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires}, {note})
  SELECT own, typ, rid, acq, exp, NULLIF(nt, '')
  FROM unnest($1::bigint[], $2::varchar[], $3::varchar[], $4::varchar[], $5::varchar[], $6::varchar[], $7::varchar[]) AS r(k, typ, rid, own, acq, exp, nt)
  WHERE ` + noRow + ` AND pg_try_advisory_xact_lock(k)
  ON CONFLICT ({type}, {rid}) DO NOTHING
  RETURNING {id}, {type}, {rid}, xmin::text AS v)
SELECT r.n, ins.{id}, ins.v, clock_timestamp() FROM ins JOIN unnest($2::varchar[], $3::varchar[]) WITH ORDINALITY AS r(typ, rid, n)
  ON ins.{type} = r.typ AND ins.{rid} = r.rid`)

// acquireBatchSQL is acquireSQL over arrays; takeBatchSQL is takeSQL's.
// cand: the rows it may change, so that another owner's active lock is not
// locked; ok: the members decided, held with their candidate locked or
// none. Result: per member decided, n and acquireSQL's row (id NULL: no change).
var acquireBatchSQL, takeBatchSQL = acquireBatch(true), acquireBatch(false)

func acquireBatch(reenter bool) [2]string {
	re := `re AS (
  UPDATE {locks} l SET {expires} = GREATEST(l.{expires}, req.exp) FROM req, cur
  WHERE l.{id} = ANY (ARRAY(SELECT {id} FROM cur)) AND l.{id} = cur.{id} AND cur.n = req.n AND l.{owner} = req.own
    AND ` + activeAtCheck("l.{expires}", "req.acq") + `
  RETURNING req.n, l.{id}, l.{acquired}, l.{expires}, l.{note}),`
	changes := "l.{expires} <= req.acq OR l.{owner} = req.own" // the rows old or re may change
	if !reenter {
		re = `re AS (SELECT 0::bigint AS n, 0::bigint AS {id}, ''::varchar AS {acquired}, ''::varchar AS {expires}, ''::varchar AS {note} WHERE false),`
		changes = "l.{expires} <= req.acq"
	}
	return pgStatements(`WITH req AS (SELECT * FROM unnest($1::bigint[], $2::varchar[], $3::varchar[], $4::varchar[], $5::varchar[], $6::varchar[], $7::varchar[])
  WITH ORDINALITY AS r(k, typ, rid, own, acq, exp, nt, n)),
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
  RETURNING req.n, l.{id}, l.{owner}, l.{acquired}, l.{expires}, l.{note}),
` + re + `
ins AS (
  INSERT INTO {locks} ({owner}, {type}, {rid}, {acquired}, {expires}, {note})
  SELECT own, typ, rid, acq, exp, NULLIF(nt, '') FROM req r
  WHERE n IN (SELECT n FROM ok) AND n NOT IN (SELECT n FROM re)
    AND n NOT IN (SELECT n FROM rows WHERE {id} NOT IN (SELECT {id} FROM old))
  ON CONFLICT ({type}, {rid}) DO NOTHING
  RETURNING {id}, {type}, {rid}, {acquired}, {expires}, {note}, xmin::text AS v)
SELECT ok.n, re.n IS NOT NULL, COALESCE(re.{id}, ins.{id}), COALESCE(re.{acquired}, ins.{acquired}), COALESCE(re.{expires}, ins.{expires}),
  CASE WHEN ins.{id} IS NOT NULL THEN old.{id} END, old.{owner}, old.{acquired}, old.{expires}, ins.v,
  CASE WHEN re.n IS NOT NULL THEN re.{note} ELSE ins.{note} END, old.{note}, clock_timestamp()
FROM ok JOIN req USING (n) LEFT JOIN re USING (n)
  LEFT JOIN ins ON ins.{type} = req.typ AND ins.{rid} = req.rid LEFT JOIN old ON old.n = req.n`)
}

// renewBatchSQL is renewSQL and renewTokenSQL over arrays (tok 0: by
// owner), locking FOR NO KEY UPDATE, which a fence lets through. Result:
// per member decided, n, false, the lock extended and the server's time
// (NULLs: none), or n and true for a member whose row was busy.
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
    AND ` + activeAtCheck("l.{expires}", "req.acq") + `
  RETURNING req.n, l.{id}, l.{acquired}, l.{expires}, l.{note})
SELECT n, false, {id}, {acquired}, {expires}, {note}, clock_timestamp() FROM up
UNION ALL
SELECT n, true, NULL, NULL, NULL, NULL, NULL FROM mine WHERE n NOT IN (SELECT n FROM cur)`)

// releaseBatchSQL is the releases by owner (tok 0) and by token (active at
// at) over arrays, with {notice} and {commit}. Result: per member decided,
// n and false (removed), or n and true (its row was busy).
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

// releaseBatch writes notice, the wake-up of the lock removed from d.typ,
// d.rid (nil: none), and commit (empty: none) into releaseBatchSQL.
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
