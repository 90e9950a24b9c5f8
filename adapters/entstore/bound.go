package entstore

import (
	"context"
	"database/sql"
	"sync"
)

// boundStmts keeps the statements bound to one transaction, so that the
// writes that share it (group commit) bind each statement once.
// tx.StmtContext allocates a statement, registers it with the transaction
// and has it closed at the end: done for every write of a batch, it was 7%
// of the time that a batch of 32 callers held SQLite's write lock.
//
// It remembers the last transaction only, which is all a backend that
// runs its writes one transaction at a time needs; it holds a reference to
// that transaction, so that no later one can be given its address.
type boundStmts struct {
	mu    sync.Mutex
	tx    *sql.Tx
	stmts map[*sql.Stmt]*sql.Stmt
}

// on returns st bound to tx.
func (b *boundStmts) on(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tx != tx {
		b.tx = tx
		clear(b.stmts)
	}
	if bound, ok := b.stmts[st]; ok {
		return bound
	}
	bound := tx.StmtContext(ctx, st)
	if b.stmts == nil {
		b.stmts = make(map[*sql.Stmt]*sql.Stmt)
	}
	b.stmts[st] = bound
	return bound
}

// On returns st to run in tx, or st itself outside a transaction. Where
// the backend shares transactions (SharedTx), the binding is kept for the
// other writes of the same transaction; elsewhere transactions run side
// by side and each binds its own.
func (s *Store) On(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	switch {
	case tx == nil:
		return st
	case s.b.SharedTx:
		return s.bound.on(ctx, tx, st)
	default:
		return tx.StmtContext(ctx, st)
	}
}
