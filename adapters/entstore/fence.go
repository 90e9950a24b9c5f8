package entstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	entsql "entgo.io/ent/dialect/sql"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// Querier runs statements inside the caller's transaction. *sql.Tx
// satisfies it, and so does the Tx of an Ent client generated with the
// sql/execquery feature (entc's --feature sql/execquery), whose
// ExecContext and QueryContext run on the transaction's connection.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// CheckFence checks, inside the caller's transaction q on the database of
// the locks, that f.Owner still holds the lock on f.Resource with token
// f.Token and that it has not expired at now (the lock service's clock:
// active while now < expires_at), with holds, the database's check, which
// also keeps that lock from changing hands until q ends (see the
// adapters' CheckFence).
//
// Errors: *domain.ValidationError for a malformed fence or a zero now;
// *domain.LockLostError (matching domain.ErrExpired) when the fence does
// not hold, with Reason LostTakenOver and NewHolder when another lock is
// on the resource now, LostExpired otherwise; the database's error,
// wrapped, when a statement fails. Only a nil error means the fence
// holds.
func CheckFence(ctx context.Context, q Querier, dialectName string, f application.Fence, now time.Time,
	holds func(ctx context.Context, q Querier, f application.Fence, now string) (bool, error)) error {
	if err := validateFence(f, now); err != nil {
		return err
	}
	held, err := holds(ctx, q, f, FormatTime(now))
	if err != nil {
		return fmt.Errorf("check the fence of owner %q on %s (token %d): %w", f.Owner, f.Resource, f.Token, err)
	}
	if held {
		return nil
	}
	return lostFence(ctx, q, dialectName, f, now)
}

func validateFence(f application.Fence, now time.Time) error {
	if err := f.Resource.Validate(); err != nil {
		return err
	}
	if err := domain.ValidateOwner(f.Owner); err != nil {
		return err
	}
	if f.Token <= 0 {
		return &domain.ValidationError{Field: "token", Reason: "must be the positive token of a held lock (application.FenceOf)"}
	}
	if now.IsZero() {
		return &domain.ValidationError{Field: "now", Reason: "must be the lock service's current time (LockService.Now)"}
	}
	return nil
}

// lostFence explains a fence that does not hold, reading the resource's
// lock as it is now in the same transaction: another lock (a new token)
// means the resource was taken over, or released and taken again; no lock,
// or the fence's own lock past its expiry, means it expired (and may have
// been cleaned up, or released).
func lostFence(ctx context.Context, q Querier, dialectName string, f application.Fence, now time.Time) error {
	b := entsql.Dialect(dialectName)
	query, args := b.Select(entlock.Columns...).
		From(b.Table(entlock.Table)).
		Where(entsql.And(
			entsql.EQ(entlock.FieldResourceType, string(f.Resource.Type)),
			entsql.EQ(entlock.FieldResourceID, f.Resource.ID))).
		Query()
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("read the lock on %s after its fence failed: %w", f.Resource, err)
	}
	defer rows.Close()
	var cur *domain.Lock
	if rows.Next() {
		if cur, err = scanLock(rows); err != nil {
			return fmt.Errorf("read the lock on %s after its fence failed: %w", f.Resource, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the lock on %s after its fence failed: %w", f.Resource, err)
	}
	return FenceLost(f, cur, now)
}

// FenceLost explains a fence f that does not hold at now, with cur the
// lock on its resource (nil for none): another lock (a new token) means
// the resource was taken over, or released and taken again; no lock, or
// the fence's own lock past its expiry, means it expired (and may have
// been cleaned up, or released).
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
