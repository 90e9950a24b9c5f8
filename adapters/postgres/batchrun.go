package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/cleveragents/locks/domain"
)

// batches runs the writes of a LockRepository in batches (group commit)
// when others of their kind are in flight, and each alone otherwise, as
// lone does: the decorator that Options.DisableGroupCommit leaves out.
type batches struct {
	frees           *batcher[writeReq, inserted]
	acquires, takes *batcher[writeReq, made]
	renewals        *batcher[writeReq, extension]
	releases        *batcher[releaseReq, bool]
	group           *batchGroup
	// life ends at Close, and with it every batch still on its way.
	life context.Context
	end  context.CancelFunc
}

// newBatches returns the queues of s's writes, whose batches end with
// parent; always: see InBatches.
func newBatches(s *LockRepository, always bool, parent context.Context) *batches {
	life, end := context.WithCancel(parent)
	release := releaseBatch(s.notice, releaseCommit)
	b := &batches{life: life, end: end,
		frees:    &batcher[writeReq, inserted]{one: s.acquireFreeOne, many: s.acquireFreeMany, undo: s.undoFree},
		acquires: &batcher[writeReq, made]{one: s.acquireOne, many: s.acquireMany(s.pick(acquireBatchSQL)), undo: s.undoMade},
		takes:    &batcher[writeReq, made]{one: s.acquireOne, many: s.acquireMany(s.pick(takeBatchSQL)), undo: s.undoMade},
		renewals: &batcher[writeReq, extension]{one: s.renewOne, many: s.renewMany},
		releases: &batcher[releaseReq, bool]{one: s.releaseOne, many: s.releaseMany(release)},
	}
	b.group = &batchGroup{leftGroup: s.left, kicks: []func(){b.frees.kick, b.acquires.kick, b.takes.kick, b.renewals.kick, b.releases.kick}}
	b.frees.unwritten, b.acquires.unwritten, b.takes.unwritten = unwritten, unwritten, unwritten
	for _, k := range b.kinds() {
		k.set(always, life, b.group)
	}
	return b
}

// queue is a batcher of any kind.
type queue interface {
	set(always bool, life context.Context, g *batchGroup)
	queued() int
	writeStats() WriteStats
}

// kinds are b's queues, one per kind of write.
func (b *batches) kinds() []queue {
	return []queue{b.frees, b.acquires, b.takes, b.renewals, b.releases}
}

func (b *batches) free(ctx context.Context, r writeReq) (inserted, error) {
	return b.frees.do(ctx, r.ref, r)
}

func (b *batches) acquire(ctx context.Context, r writeReq) (made, error) {
	if r.take {
		return b.takes.do(ctx, r.ref, r)
	}
	return b.acquires.do(ctx, r.ref, r)
}

func (b *batches) acquireAlone(ctx context.Context, r writeReq) (made, error) {
	if r.take {
		return b.takes.runAlone(ctx, r)
	}
	return b.acquires.runAlone(ctx, r)
}

func (b *batches) renew(ctx context.Context, r writeReq) (extension, error) {
	return b.renewals.do(ctx, r.ref, r)
}

func (b *batches) release(ctx context.Context, r releaseReq) (bool, error) {
	return b.releases.do(ctx, r.ref, r)
}

func (b *batches) stop() { b.end() }

// InBatches returns a view of s, on the same database, that runs every
// acquire, renewal and release through its batch statement, even alone,
// and returns the statement's errors as they are: for the contract suite,
// which holds the batch statements to the rules state by state, as it
// holds the lone ones.
func (s *LockRepository) InBatches() *LockRepository {
	v := &LockRepository{Store: s.Store, db: s.db, localTime: s.localTime, left: &leftGroup{}, undoSQL: s.undoSQL, notice: s.notice}
	parent := context.Background()
	if b, ok := s.w.(*batches); ok {
		parent = b.life
	}
	v.w = newBatches(v, true, parent)
	return v
}

// Queued returns how many writes wait in s's queues for the next batch:
// a measure of the load, which is zero while every write finds nothing of
// its kind in flight, and always without group commit.
func (s *LockRepository) Queued() int {
	n := 0
	if b, ok := s.w.(*batches); ok {
		for _, k := range b.kinds() {
			n += k.queued()
		}
	}
	return n
}

// WriteStats returns the counts of s's acquires, renewals and releases
// so far; none without group commit.
func (s *LockRepository) WriteStats() WriteStats {
	var w WriteStats
	if b, ok := s.w.(*batches); ok {
		for _, k := range b.kinds() {
			w.add(k.writeStats())
		}
	}
	return w
}

// badConnAgain bounds how often a batch that met a bad connection runs
// again.
const badConnAgain = 3

// scanBatch runs a batch statement and sets the outcome of each member
// that a row names, as scan reads it, or leaves it to run alone. A member
// that no row names keeps the zero outcome, which is always safe to act
// on: nothing was inserted (the acquire goes on to acquireSQL), extended
// (to Update) or removed (there was nothing of the caller's to remove);
// with unnamedAlone, it runs its own statement instead (an acquire the
// batch could not decide: acquireMany).
func scanBatch[Req, Res any](ctx context.Context, s *LockRepository, ops []*batchOp[Req, Res], query string, args []any, unnamedAlone bool,
	scan func(rows *sql.Rows) (n int64, res Res, alone bool, err error)) error {
	rows, err := s.db.QueryContext(ctx, query, args...)
	// A connection the driver knew to be bad was not sent the statement:
	// the batch runs again, on another (see the PostgreSQL adapter's
	// retryable).
	for again := 0; errors.Is(err, driver.ErrBadConn) && again < badConnAgain; again++ {
		rows, err = s.db.QueryContext(ctx, query, args...)
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

// acquireFreeMany runs acquireFreeBatchSQL.
func (s *LockRepository) acquireFreeMany(ctx context.Context, ops []*batchOp[writeReq, inserted]) error {
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

// acquireMany returns the batch run of statement, acquireBatchSQL or
// takeBatchSQL. A member that the statement did not decide (its
// resource's advisory lock or its row was busy) runs its own statement,
// which waits for them, rather than going straight to Update: a lone
// statement whose caller leaves is undone like a batch's (runOne).
func (s *LockRepository) acquireMany(statement string) func(context.Context, []*batchOp[writeReq, made]) error {
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

// renewMany runs renewBatchSQL.
func (s *LockRepository) renewMany(ctx context.Context, ops []*batchOp[writeReq, extension]) error {
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

// releaseMany returns the batch run of releaseBatchSQL as written with the
// backend's wake-up, query.
func (s *LockRepository) releaseMany(query string) func(context.Context, []*batchOp[releaseReq, bool]) error {
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
