package entstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Querier runs statements inside the caller's transaction: a *sql.Tx, or
// the Tx of an Ent client generated with the sql/execquery feature.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// CheckFence checks in the caller's transaction q, with holds, the
// database's check, that f.Owner still holds f.Resource's lock with token
// f.Token, active at now (the lock service's clock). holds also keeps the
// lock from changing hands until q ends.
//
// Errors: *domain.ValidationError for a malformed fence or a zero now;
// *domain.LockLostError (matching domain.ErrExpired) when the fence does
// not hold, with Reason LostTakenOver and NewHolder when another lock is
// on the resource now, LostExpired otherwise; the database's error,
// wrapped, when a statement fails. Only a nil error means the fence
// holds.
func CheckFence(ctx context.Context, q Querier, dialectName string, f application.Fence, now time.Time,
	holds func(ctx context.Context, q Querier, f application.Fence, now string) (bool, error)) error {
	if err := f.Resource.Validate(); err != nil {
		return err
	}
	if err := domain.ValidateOwner(f.Owner); err != nil {
		return err
	}
	switch {
	case f.Token <= 0:
		return &domain.ValidationError{Field: "token", Reason: "must be the positive token of a held lock (application.FenceOf)"}
	case now.IsZero():
		return &domain.ValidationError{Field: "now", Reason: "must be the lock service's current time (LockService.Now)"}
	}
	switch held, err := holds(ctx, q, f, FormatTime(now)); {
	case err != nil:
		return fmt.Errorf("check the fence of owner %q on %s (token %d): %w", f.Owner, f.Resource, f.Token, err)
	case held:
		return nil
	}
	// Explain the loss by the lock on the resource now, in q.
	var cur *domain.Lock
	rows, err := q.QueryContext(ctx, buildStatements(dialectName).sel, string(f.Resource.Type), f.Resource.ID)
	if err == nil {
		defer rows.Close()
		if rows.Next() {
			cur, err = scanLock(rows, true)
		}
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		return fmt.Errorf("read the lock on %s after its fence failed: %w", f.Resource, err)
	}
	return FenceLost(f, cur, now)
}

// FenceLost explains a fence f that does not hold at now, with cur the
// lock on its resource (nil for none): another lock means the resource was
// taken over; none, or the fence's own lock, means it expired.
func FenceLost(f application.Fence, cur *domain.Lock, now time.Time) *domain.LockLostError {
	lost := &domain.LockLostError{
		Lock:   domain.Lock{Token: f.Token, Owner: f.Owner, Resource: f.Resource},
		Reason: domain.LostExpired,
		At:     now,
	}
	switch {
	case cur == nil:
	case cur.Token != f.Token || cur.Owner != f.Owner:
		lost.Reason, lost.NewHolder = domain.LostTakenOver, cur
	default:
		lost.Lock = *cur // the fence's own lock, expired but not yet removed
	}
	return lost
}

// ExplainStale explains err, a fence f that failed at now on the old
// snapshot of the caller's transaction, by the committed lock that read
// gives: if still held, stale's *domain.StaleSnapshotError (held: the lock
// read, or nil; isolation: the level, or ""; cause: the database's
// refusal); if lost, the *domain.LockLostError of what happened to it.
func ExplainStale(ctx context.Context, err error, f application.Fence, now time.Time,
	read func(context.Context, domain.ResourceRef) (domain.Lock, error), format func(op string, err error) error,
	stale func(held *domain.Lock, isolation string, cause error) *domain.StaleSnapshotError) error {
	cause, isolation := err, "" // cause: the database's refusal
	snap, ok := errors.AsType[*domain.StaleSnapshotError](err)
	if ok {
		cause, isolation = nil, snap.Isolation
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
