package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

const snapshotAdvice = "roll the transaction back and run it again, with the fence at READ COMMITTED " +
	"(sql.TxOptions{Isolation: sql.LevelReadCommitted}) or as the transaction's first statement, " +
	"so that it reads the lock as committed now"

// snapshotMayBeOld refines lost, a fence that did not hold in q: above
// READ COMMITTED, q's snapshot may predate the lock or its renewal, and
// only a newer lock in it (tokens only grow) proves the lock gone.
func snapshotMayBeOld(ctx context.Context, q entstore.Querier, f application.Fence, lost error) error {
	var l *domain.LockLostError
	if !errors.As(lost, &l) || (l.NewHolder != nil && l.NewHolder.Token > f.Token) {
		return lost
	}
	rows, err := q.QueryContext(ctx, "SELECT current_setting('transaction_isolation')")
	if err != nil {
		return fmt.Errorf("read the isolation level of the transaction whose fence on %s failed: %w", f.Resource, err)
	}
	defer rows.Close()
	var level string
	if rows.Next() {
		err = rows.Scan(&level)
	}
	if err = errors.Join(err, rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("read the isolation level of the transaction whose fence on %s failed: %w", f.Resource, err)
	}
	if level == "read committed" || level == "read uncommitted" { // PostgreSQL runs the latter as the former
		return lost
	}
	return StaleFence(f, strings.ToUpper(level), nil, nil)
}

// StaleFence is the error of a PostgreSQL fence f that failed on its
// transaction's old snapshot at isolation ("" unknown); held is the lock
// read outside it, nil when unknown; cause is the database's report.
func StaleFence(f application.Fence, isolation string, held *domain.Lock, cause error) *domain.StaleSnapshotError {
	level := "above READ COMMITTED"
	if isolation != "" {
		level = "at " + isolation
	}
	lock := fmt.Sprintf("the lock of owner %q on %s (token %d)", f.Owner, f.Resource, f.Token)
	what := fmt.Sprintf("%s may be held, but the fence cannot see it: the transaction runs %s, and its snapshot, "+
		"taken at its first statement, is older than the lock or its last change", lock, level)
	if held != nil {
		what = fmt.Sprintf("%s is held (until %s), but the fence cannot see it: the transaction runs %s, and its snapshot, "+
			"taken at its first statement, is older than the lock or its last renewal",
			lock, held.ExpiresAt.UTC().Format("2006-01-02T15:04:05.999999Z07:00"), level)
	}
	return &domain.StaleSnapshotError{
		Op:        "check a fence",
		What:      what,
		Isolation: isolation,
		Held:      held != nil,
		Advice:    snapshotAdvice,
		Err:       cause,
	}
}
