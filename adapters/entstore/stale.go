package entstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// ExplainStale explains err, a fence f that failed at now on the old
// snapshot of the caller's transaction (PostgreSQL above READ COMMITTED,
// a SQLite deferred transaction that read first), from the lock as
// committed, which read gives, outside the transaction: a held lock gives
// the database's *domain.StaleSnapshotError (stale: held is the lock read,
// nil when unknown; isolation the transaction's level, "" when unknown;
// cause the database's refusal), which says so (retry), a lost one the
// *domain.LockLostError of what happened to it. The fence failed either
// way: the transaction must not write.
func ExplainStale(ctx context.Context, err error, f application.Fence, now time.Time,
	read func(context.Context, domain.ResourceRef) (domain.Lock, error), format func(op string, err error) error,
	stale func(held *domain.Lock, isolation string, cause error) *domain.StaleSnapshotError) error {
	var (
		cause     error
		isolation string
		snap      *domain.StaleSnapshotError
	)
	if errors.As(err, &snap) {
		isolation = snap.Isolation
	} else {
		cause = err // the database's refusal
	}
	cur, gerr := read(ctx, f.Resource)
	switch {
	case gerr == nil && cur.Token == f.Token && cur.Owner == f.Owner && now.Before(cur.ExpiresAt):
		return stale(&cur, isolation, cause)
	case gerr == nil:
		return FenceLost(f, &cur, now)
	case errors.Is(gerr, domain.ErrNotFound):
		return FenceLost(f, nil, now)
	case ctx.Err() != nil:
		return Explain(ctx, err, "fenced write", format)
	}
	snap = stale(nil, isolation, cause)
	snap.Err = errors.Join(cause, fmt.Errorf("reading the lock outside the transaction: %w", gerr))
	return snap
}
