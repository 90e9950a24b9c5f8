package entstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// PostgresBatching is what the PostgreSQL adapter adds to the batches of
// a PostgresStore (batch.go).
type PostgresBatching struct {
	// EveryBody says whether a batch's error is every member's: the
	// connection or the server failed, as each member's own statement
	// would have. Any other error leaves every member to run alone.
	EveryBody func(error) bool
	// Notice returns the SQL expression that sends the wake-up of a lock
	// removed from the resource whose type and id are the expressions typ
	// and id (pg_notify). Nil: no wake-up.
	Notice func(typ, id string) string
	// Unwritten says whether a write's error shows that it wrote nothing:
	// its statement was never sent, or the server cancelled it (which it
	// does not do to a commit under way). An acquire whose caller left and
	// that failed so leaves nothing to undo; any other failure leaves its
	// outcome unknown, which Close reports. Nil: every failure is unknown.
	Unwritten func(error) bool
	// ReleaseCommit is an SQL expression that a batch of releases
	// evaluates for each lock it removes, for its effect on the commit of
	// the batch's transaction (the PostgreSQL adapter's lets it return
	// before the WAL flush). Empty: none.
	ReleaseCommit string
	// RowBusy says whether an acquire statement's error is its refusal
	// to wait longer than rowWait for a lock's row that another
	// transaction holds (lock_not_available): nothing was written. Nil:
	// no error is.
	RowBusy func(error) bool
}

// writeReq is one member of a batch of acquires or renewals: its
// resource's advisory lock key, its resource, its owner, now and the new
// expiry as stored, and for a renewal the token (0: by owner).
type writeReq struct {
	key          int64
	ref          domain.ResourceRef
	owner        string
	now, expires string
	token        int64
}

// releaseReq is one member of a batch of releases: by owner (token 0) or
// by token, active at now.
type releaseReq struct {
	ref   domain.ResourceRef
	owner string
	token int64
	now   string
}

// inserted is the outcome of acquireFreeSQL for one caller.
type inserted struct {
	token int64
	ok    bool // false: the resource has a row
	// version is the row version a batch wrote (its xmin), for undo.
	version string
}

// made is the outcome of acquireSQL or takeSQL for one caller.
type made struct {
	a       application.Acquisition
	decided bool   // false: no row came back
	version string // the row version a batch inserted (its xmin), for undo
}

// extension is the outcome of renewSQL or renewTokenSQL for one caller.
type extension struct {
	token    int64
	times    [2]string // acquired, expires
	extended bool      // false: no row came back
}

// batchers are the queues of a PostgresStore's writes.
type batchers struct {
	free          *batcher[writeReq, inserted]
	acquire, take *batcher[writeReq, made]
	renew         *batcher[writeReq, extension]
	release       *batcher[releaseReq, bool]
	group         *batchGroup
}

// InBatches returns a view of s, on the same database, that runs every
// acquire, renewal and release through its batch statement, even alone,
// and returns the statement's errors as they are: for the contract suite,
// which holds the batch statements to the rules state by state, as it
// holds the lone ones.
func (s *PostgresStore) InBatches() *PostgresStore {
	v := &PostgresStore{Store: s.Store, key: s.key, batching: s.batching, life: s.life, stop: s.stop, undoSQL: s.undoSQL}
	v.batch = v.newBatchers(s.batching, true)
	return v
}

// newBatchers returns s's queues; always: see InBatches.
func (s *PostgresStore) newBatchers(p PostgresBatching, always bool) batchers {
	every := p.EveryBody
	if every == nil {
		every = func(error) bool { return true }
	}
	release := releaseBatch(p.Notice, p.ReleaseCommit)
	undo := func(r writeReq, a made) bool {
		if a.decided && !a.a.Reentered && a.version != "" {
			return s.undo(r.ref, a.a.Lock.Token, a.version)
		}
		return true
	}
	b := batchers{
		free: &batcher[writeReq, inserted]{one: s.acquireFreeOne, many: s.acquireFreeMany, everyBody: every,
			undo: func(r writeReq, in inserted) bool {
				if in.ok {
					return s.undo(r.ref, in.token, in.version)
				}
				return true
			}},
		acquire: &batcher[writeReq, made]{one: s.acquireOne(s.pick(acquireSQL)), many: s.acquireMany(s.pick(acquireBatchSQL)),
			everyBody: every, undo: undo},
		take: &batcher[writeReq, made]{one: s.acquireOne(s.pick(takeSQL)), many: s.acquireMany(s.pick(takeBatchSQL)),
			everyBody: every, undo: undo},
		renew:   &batcher[writeReq, extension]{one: s.renewOne, many: s.renewMany, everyBody: every},
		release: &batcher[releaseReq, bool]{one: s.releaseOne, many: s.releaseMany(release), everyBody: every},
	}
	b.free.always, b.acquire.always, b.take.always, b.renew.always, b.release.always = always, always, always, always, always
	b.free.life, b.acquire.life, b.take.life, b.renew.life, b.release.life = s.life, s.life, s.life, s.life, s.life
	b.free.unwritten, b.acquire.unwritten, b.take.unwritten = p.Unwritten, p.Unwritten, p.Unwritten
	g := &batchGroup{kicks: []func(){b.free.kick, b.acquire.kick, b.take.kick, b.renew.kick, b.release.kick}}
	b.free.group, b.acquire.group, b.take.group, b.renew.group, b.release.group = g, g, g, g, g
	b.group = g
	return b
}

// Queued returns how many writes wait in s's queues for the next batch:
// a measure of the load, which is zero while every write finds nothing of
// its kind in flight.
func (s *PostgresStore) Queued() int {
	n := 0
	for _, q := range []interface{ queued() int }{s.batch.free, s.batch.acquire, s.batch.take, s.batch.renew, s.batch.release} {
		n += q.queued()
	}
	return n
}

// WriteStats returns the counts of s's acquires, renewals and releases
// so far.
func (s *PostgresStore) WriteStats() WriteStats {
	var w WriteStats
	for _, q := range []interface{ writeStats() WriteStats }{s.batch.free, s.batch.acquire, s.batch.take, s.batch.renew, s.batch.release} {
		w.add(q.writeStats())
	}
	return w
}

// badConnAgain bounds how often a batch that met a bad connection runs
// again.
const badConnAgain = 3

// undoTimeout bounds the release of a lock acquired for a caller that
// left: past it, the lock expires on its own.
const undoTimeout = 10 * time.Second

// undo releases the lock token on ref, acquired in a batch for a caller
// that had left, if its row is still the version the batch wrote (its
// xmin, the batch's transaction): the same owner's next acquire re-enters
// it, which keeps the token, and that caller holds it; its update writes
// a new version, even when its times are the batch's to the microsecond
// (a clock that stands still, two calls in one microsecond).
//
// It reports whether the database answered (whether or not the version
// was still there to release).
func (s *PostgresStore) undo(ref domain.ResourceRef, token int64, version string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	n, err := writeStatement(ctx, s.Store, func(ctx context.Context) (int64, error) {
		res, err := s.write.ExecContext(ctx, s.undoSQL, token, version)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	if err == nil && n > 0 {
		s.occupied.note(ref, false)
	}
	return err == nil
}

// scanBatch runs a batch statement and sets the outcome of each member
// that a row names, as scan reads it, or leaves it to run alone. A member
// that no row names keeps the zero outcome, which is always safe to act
// on: nothing was inserted (the acquire goes on to acquireSQL), extended
// (to Update) or removed (there was nothing of the caller's to remove);
// with unnamedAlone, it runs its own statement instead (an acquire the
// batch could not decide: acquireMany).
func scanBatch[Req, Res any](ctx context.Context, s *PostgresStore, ops []*batchOp[Req, Res], query string, args []any, unnamedAlone bool,
	scan func(rows *sql.Rows) (n int64, res Res, alone bool, err error)) error {
	rows, err := s.write.QueryContext(ctx, query, args...)
	// A connection the driver knew to be bad was not sent the statement:
	// the batch runs again, on another (see the PostgreSQL adapter's
	// retryable).
	for again := 0; errors.Is(err, driver.ErrBadConn) && again < badConnAgain; again++ {
		rows, err = s.write.QueryContext(ctx, query, args...)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	named := make([]bool, len(ops))
	for rows.Next() {
		n, res, alone, err := scan(rows)
		if err != nil {
			return err
		}
		if n < 1 || n > int64(len(ops)) || named[n-1] {
			return &domain.StoreError{Op: "read a batch's outcome", Kind: domain.StoreCorrupt,
				Err: fmt.Errorf("a row names member %d of %d twice or not at all", n, len(ops))}
		}
		named[n-1] = true
		ops[n-1].res, ops[n-1].alone = res, alone
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if unnamedAlone {
		for i, op := range ops {
			if !named[i] {
				op.alone = true
			}
		}
	}
	return nil
}

// writeArgs are the arrays of a batch of acquires (or, withToken, of
// renewals).
func writeArgs[Res any](ops []*batchOp[writeReq, Res], withToken bool) []any {
	var (
		keys          = make([]int64, len(ops))
		types, ids    = make([]string, len(ops)), make([]string, len(ops))
		owners        = make([]string, len(ops))
		nows, expires = make([]string, len(ops)), make([]string, len(ops))
		tokens        []int64
	)
	if withToken {
		tokens = make([]int64, len(ops))
	}
	for i, op := range ops {
		r := op.req
		keys[i], types[i], ids[i], owners[i], nows[i], expires[i] = r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires
		if withToken {
			tokens[i] = r.token
		}
	}
	if withToken {
		return []any{keys, types, ids, owners, nows, expires, tokens}
	}
	return []any{keys, types, ids, owners, nows, expires}
}

// acquireFreeOne runs acquireFreeSQL for one caller.
func (s *PostgresStore) acquireFreeOne(ctx context.Context, r writeReq) (inserted, error) {
	return writeStatement(ctx, s.Store, func(ctx context.Context) (inserted, error) {
		var (
			token   int64
			version string
		)
		err := s.write.QueryRowContext(ctx, acquireFreeSQL, r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires).Scan(&token, &version)
		if errors.Is(err, sql.ErrNoRows) {
			return inserted{}, nil
		}
		return inserted{token: token, ok: err == nil, version: version}, err
	})
}

// acquireFreeMany runs acquireFreeBatchSQL.
func (s *PostgresStore) acquireFreeMany(ctx context.Context, ops []*batchOp[writeReq, inserted]) error {
	return scanBatch(ctx, s, ops, acquireFreeBatchSQL, writeArgs(ops, false), false, func(rows *sql.Rows) (int64, inserted, bool, error) {
		var (
			n       int64
			token   int64
			version string
		)
		err := rows.Scan(&n, &token, &version)
		return n, inserted{token: token, ok: true, version: version}, false, err
	})
}

// acquireOne returns the lone run of statement, acquireSQL or takeSQL.
func (s *PostgresStore) acquireOne(statement string) func(context.Context, writeReq) (made, error) {
	return func(ctx context.Context, r writeReq) (made, error) {
		return writeStatement(ctx, s.Store, func(ctx context.Context) (made, error) {
			rows, err := s.write.QueryContext(ctx, statement, r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires)
			if err != nil {
				return made{}, err
			}
			defer rows.Close()
			if !rows.Next() {
				if err := rows.Err(); err != nil {
					return made{}, err
				}
				return made{}, rows.Close()
			}
			a, version, err := scanAcquisition(rows, r.ref, r.owner)
			if err != nil {
				return made{}, err
			}
			return made{a: a, decided: true, version: version}, rows.Close()
		})
	}
}

// acquireMany returns the batch run of statement, acquireBatchSQL or
// takeBatchSQL. A member that the statement did not decide (its
// resource's advisory lock or its row was busy) runs its own statement,
// which waits for them, rather than going straight to Update: a lone
// statement whose caller leaves is undone like a batch's (runOne), and
// an Update transaction cut during its commit is not.
func (s *PostgresStore) acquireMany(statement string) func(context.Context, []*batchOp[writeReq, made]) error {
	return func(ctx context.Context, ops []*batchOp[writeReq, made]) error {
		return scanBatch(ctx, s, ops, statement, writeArgs(ops, false), true, func(rows *sql.Rows) (int64, made, bool, error) {
			var (
				n         int64
				reentered bool
				id        sql.NullInt64
				times     [2]sql.NullString // acquired, expires
				prevID    sql.NullInt64     // the lock replaced, if any:
				prev      [3]sql.NullString // its owner, acquired, expires
				version   sql.NullString    // of the row inserted
			)
			if err := rows.Scan(&n, &reentered, &id, &times[0], &times[1], &prevID, &prev[0], &prev[1], &prev[2], &version); err != nil {
				return 0, made{}, false, err
			}
			if !id.Valid {
				return n, made{}, false, nil
			}
			op, err := memberOf(ops, n)
			if err != nil {
				return 0, made{}, false, err
			}
			a, err := acquisitionOf(op.req.ref, op.req.owner, reentered, id.Int64, times[0].String, times[1].String, prevID, prev)
			return n, made{a: a, decided: true, version: version.String}, false, err
		})
	}
}

// renewOne runs renewSQL, or renewTokenSQL for a token, for one caller.
func (s *PostgresStore) renewOne(ctx context.Context, r writeReq) (extension, error) {
	query, args := renewSQL, []any{r.key, string(r.ref.Type), r.ref.ID, r.owner, r.now, r.expires}
	if r.token != 0 {
		query, args = renewTokenSQL, append(args, r.token)
	}
	return writeStatement(ctx, s.Store, func(ctx context.Context) (extension, error) {
		var e extension
		err := s.write.QueryRowContext(ctx, query, args...).Scan(&e.token, &e.times[0], &e.times[1])
		if errors.Is(err, sql.ErrNoRows) {
			return extension{}, nil
		}
		e.extended = err == nil
		return e, err
	})
}

// renewMany runs renewBatchSQL.
func (s *PostgresStore) renewMany(ctx context.Context, ops []*batchOp[writeReq, extension]) error {
	return scanBatch(ctx, s, ops, renewBatchSQL, writeArgs(ops, true), false, func(rows *sql.Rows) (int64, extension, bool, error) {
		var (
			n     int64
			busy  bool
			id    sql.NullInt64
			times [2]sql.NullString
		)
		err := rows.Scan(&n, &busy, &id, &times[0], &times[1])
		return n, extension{token: id.Int64, times: [2]string{times[0].String, times[1].String}, extended: id.Valid}, busy, err
	})
}

// releaseOne runs the Store's release by owner or by token for one
// caller, and returns whether it removed the lock.
func (s *PostgresStore) releaseOne(ctx context.Context, r releaseReq) (bool, error) {
	var n int64
	var err error
	if r.token == 0 {
		n, err = s.deleteOwned(ctx, r.ref, r.owner)
	} else {
		n, err = s.deleteToken(ctx, r.ref, r.token, r.now)
	}
	return n > 0, err
}

// releaseMany returns the batch run of releaseBatchSQL as written with the
// backend's wake-up, query.
func (s *PostgresStore) releaseMany(query string) func(context.Context, []*batchOp[releaseReq, bool]) error {
	return func(ctx context.Context, ops []*batchOp[releaseReq, bool]) error {
		var (
			types, ids = make([]string, len(ops)), make([]string, len(ops))
			owners     = make([]string, len(ops))
			tokens     = make([]int64, len(ops))
			nows       = make([]string, len(ops))
		)
		for i, op := range ops {
			r := op.req
			types[i], ids[i], owners[i], tokens[i], nows[i] = string(r.ref.Type), r.ref.ID, r.owner, r.token, r.now
		}
		return scanBatch(ctx, s, ops, query, []any{types, ids, owners, tokens, nows}, false, func(rows *sql.Rows) (int64, bool, bool, error) {
			var (
				n    int64
				busy bool
			)
			err := rows.Scan(&n, &busy)
			return n, !busy, busy, err
		})
	}
}

// memberOf returns the member that a batch's row numbers n (from 1).
func memberOf[Req, Res any](ops []*batchOp[Req, Res], n int64) (*batchOp[Req, Res], error) {
	if n < 1 || n > int64(len(ops)) {
		return nil, &domain.StoreError{Op: "read a batch's outcome", Kind: domain.StoreCorrupt,
			Err: fmt.Errorf("a row names member %d of %d", n, len(ops))}
	}
	return ops[n-1], nil
}
