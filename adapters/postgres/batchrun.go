package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/cleveragents/locks/domain"
)

// batches is the group commit decorator of lone (batch.go).
type batches struct {
	frees, acquires, takes, renewals *batcher[writeReq, made]
	releases                         *batcher[releaseReq, bool]
	group                            *batchGroup
	// life ends at Close, and with it every batch still on its way.
	life context.Context
	end  context.CancelFunc
}

// newBatches returns s's queues, whose batches end with parent; always: see InBatches.
func newBatches(s *LockRepository, always bool, parent context.Context) *batches {
	life, end := context.WithCancel(parent)
	withToken := func(r writeReq) []any { return append(r.args(), r.token) }
	releaseArgs := func(r releaseReq) []any { return []any{string(r.ref.Type), r.ref.ID, r.owner, r.token, r.now} }
	// batchRun's flags: a busy column; a member the batch left undecided runs alone.
	b := &batches{life: life, end: end,
		frees:    &batcher[writeReq, made]{one: s.acquireFreeOne, many: batchRun(s, acquireFreeBatchSQL, writeReq.acquireArgs, false, false, freeCols), undo: s.undoMade},
		acquires: &batcher[writeReq, made]{one: s.acquireOne, many: batchRun(s, s.pick(acquireBatchSQL), writeReq.acquireArgs, false, true, acquireCols), undo: s.undoMade},
		takes:    &batcher[writeReq, made]{one: s.acquireOne, many: batchRun(s, s.pick(takeBatchSQL), writeReq.acquireArgs, false, true, acquireCols), undo: s.undoMade},
		renewals: &batcher[writeReq, made]{one: s.renewOne, many: batchRun(s, renewBatchSQL, withToken, true, false, renewCols)},
		// A release's row names it removed, or busy (then its res is unused).
		releases: &batcher[releaseReq, bool]{one: s.releaseOne, many: batchRun(s, releaseBatch(s.notice, releaseCommit), releaseArgs, true, false,
			func(removed *bool) []any { *removed = true; return nil })},
	}
	b.group = &batchGroup{leftGroup: s.left, kicks: []func(){b.frees.kick, b.acquires.kick, b.takes.kick, b.renewals.kick, b.releases.kick}}
	for _, k := range b.kinds() {
		k.set(always, life, b.group)
	}
	return b
}

type queue interface {
	set(always bool, life context.Context, g *batchGroup)
	queued() int
	writeStats() WriteStats
}

func (b *batches) kinds() []queue {
	return []queue{b.frees, b.acquires, b.takes, b.renewals, b.releases}
}

func (b *batches) free(ctx context.Context, r writeReq) (made, error) {
	return b.frees.do(ctx, r.ref, r)
}

func (b *batches) acquiring(r writeReq) *batcher[writeReq, made] {
	if r.take {
		return b.takes
	}
	return b.acquires
}

func (b *batches) acquire(ctx context.Context, r writeReq) (made, error) {
	return b.acquiring(r).do(ctx, r.ref, r)
}

func (b *batches) acquireAlone(ctx context.Context, r writeReq) (made, error) {
	return b.acquiring(r).runAlone(ctx, r)
}

func (b *batches) renew(ctx context.Context, r writeReq) (made, error) {
	return b.renewals.do(ctx, r.ref, r)
}

func (b *batches) release(ctx context.Context, r releaseReq) (bool, error) {
	return b.releases.do(ctx, r.ref, r)
}

func (b *batches) stop() { b.end() }

// InBatches returns a view of s that runs every write through its batch
// statement, even alone, returning its errors as they are: for the
// contract suite, which holds the batch statements to the rules.
func (s *LockRepository) InBatches() *LockRepository {
	v := &LockRepository{Store: s.Store, db: s.db, localTime: s.localTime, left: &leftGroup{}, undoSQL: s.undoSQL, notice: s.notice, clocks: s.clocks}
	parent := context.Background()
	if b, ok := s.w.(*batches); ok {
		parent = b.life
	}
	v.w = newBatches(v, true, parent)
	return v
}

// Queued returns how many writes wait in s's queues for the next batch
// (always zero without group commit).
func (s *LockRepository) Queued() int {
	n := 0
	if b, ok := s.w.(*batches); ok {
		for _, k := range b.kinds() {
			n += k.queued()
		}
	}
	return n
}

// WriteStats returns the counts of s's writes (none without group commit).
func (s *LockRepository) WriteStats() WriteStats {
	var w WriteStats
	if b, ok := s.w.(*batches); ok {
		for _, k := range b.kinds() {
			w.add(k.writeStats())
		}
	}
	return w
}

// badConnAgain bounds the runs again of a batch that met a bad connection.
const badConnAgain = 3

// batchRun returns the run of query over the arrays of each member's args:
// cols says where the columns after n (and busy, with busyCol) go. A member
// no row names keeps the zero outcome, always safe, or, with unnamedAlone,
// runs alone (an acquire, undone if its caller leaves, unlike an Update).
func batchRun[Req, Res any](s *LockRepository, query string, args func(Req) []any, busyCol, unnamedAlone bool,
	cols func(*Res) []any) func(context.Context, []*batchOp[Req, Res]) error {
	return func(ctx context.Context, ops []*batchOp[Req, Res]) error {
		arrays := columns(ops, args)
		sent := s.clocks.send()
		rows, err := s.db.QueryContext(ctx, query, arrays...)
		// A connection the driver knew to be bad was not sent the statement.
		for again := 0; errors.Is(err, driver.ErrBadConn) && again < badConnAgain; again++ {
			rows, err = s.db.QueryContext(ctx, query, arrays...)
		}
		if err != nil {
			return err
		}
		defer rows.Close()
		named := make([]bool, len(ops))
		for rows.Next() {
			var (
				n    int64
				busy bool
				res  Res
			)
			head := []any{&n}
			if busyCol {
				head = append(head, &busy)
			}
			if err := rows.Scan(append(head, cols(&res)...)...); err != nil {
				return err
			}
			if n < 1 || n > int64(len(ops)) || named[n-1] {
				return &domain.StoreError{Op: "read a batch's outcome", Kind: domain.StoreCorrupt,
					Err: fmt.Errorf("a row names member %d of %d twice or not at all", n, len(ops))}
			}
			named[n-1] = true
			ops[n-1].res, ops[n-1].alone = res, busy
			if m, ok := any(res).(made); ok && m.server.Valid {
				sent.answered(m.server.Time)
				sent = clockSend{} // once: the first row is the earliest answer
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if err := rows.Close(); err != nil {
			return err
		}
		for i, op := range ops {
			op.alone = op.alone || unnamedAlone && !named[i]
		}
		return nil
	}
}

// columns are a batch statement's arrays: column j holds parameter j of
// every member (args), as []int64 or []string.
func columns[Req, Res any](ops []*batchOp[Req, Res], args func(Req) []any) []any {
	cols := args(ops[0].req)
	for j, v := range cols {
		if _, ok := v.(int64); ok {
			cols[j] = make([]int64, len(ops))
		} else {
			cols[j] = make([]string, len(ops))
		}
	}
	for i, op := range ops {
		for j, v := range args(op.req) {
			if c, ok := cols[j].([]int64); ok {
				c[i] = v.(int64)
			} else {
				cols[j].([]string)[i] = v.(string)
			}
		}
	}
	return cols
}
