package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cleveragents/locks"
)

// fillRows inserts n locks of other resources into the SQLite file at
// path, which has the module's schema, all expiring at expires, in one
// statement, and checkpoints the WAL so that the measurement starts from
// a clean file. It goes through database/sql, not the module: filling is
// not what is measured.
func fillRows(ctx context.Context, path string, n int, expires time.Time) error {
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	expires = expires.UTC().Truncate(time.Microsecond)
	_, err = db.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
INSERT INTO locks (owner_id, resource_type, resource_id, acquired_at, expires_at)
SELECT 'bench-filler', 'project', 'filler-' || i, ?, ? FROM n`,
		n, expires.Add(-time.Hour).Format(timeLayout), expires.Format(timeLayout))
	if err != nil {
		return fmt.Errorf("filling %d rows: %w", n, err)
	}
	_, err = db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	return err
}

// runTableSizes compares the module's one-caller cycle on a file holding
// opts.rows[0] unexpired locks of other resources with one holding
// opts.rows[1], in interleaved rounds.
func runTableSizes(ctx context.Context, env *environment, opts options) (scenarioResult, error) {
	var sized []contender
	for _, n := range opts.rows {
		sized = append(sized, contender{
			name: fmt.Sprintf("module-sqlite, %s rows", count(n)),
			open: func(ctx context.Context, env *environment) (instance, error) {
				path := env.file(fmt.Sprintf("rows-%d", n))
				if err := createSchema(ctx, path); err != nil {
					return nil, err
				}
				if err := fillRows(ctx, path, n, time.Now().Add(time.Hour)); err != nil {
					return nil, err
				}
				return openModule(ctx, locks.Config{Database: path})
			},
		})
	}
	return runScenario(ctx, env, scenario{name: "1 caller", callers: 1}, sized, opts)
}

// cleanupResult is what a concurrent acquirer saw while the module purged
// a backlog of expired locks, and alone on the same file afterwards.
type cleanupResult struct {
	rows   int
	purges []time.Duration // how long each purge took
	during []time.Duration // the acquirer's cycles during the purges
	idle   []time.Duration // its cycles alone, as long again, after each purge
}

// runCleanup fills a file with opts.expired expired locks, opens the
// module on it without its startup cleanup, and purges them with
// Locks.CleanupExpired while one caller cycles a resource of its own;
// then lets the caller cycle alone for as long as the purge took.
func runCleanup(ctx context.Context, env *environment, opts options) (*cleanupResult, error) {
	out := &cleanupResult{rows: opts.expired}
	for range opts.cleanupRounds {
		if err := cleanupRound(ctx, env, opts.expired, out); err != nil {
			return nil, err
		}
	}
	sortDurations(out.during, out.idle)
	return out, nil
}

func cleanupRound(ctx context.Context, env *environment, rows int, out *cleanupResult) error {
	path := env.file("cleanup")
	if err := createSchema(ctx, path); err != nil {
		return err
	}
	if err := fillRows(ctx, path, rows, time.Now().Add(-time.Hour)); err != nil {
		return err
	}
	m, err := openModule(ctx, locks.Config{Database: path, SkipStartupCleanup: true})
	if err != nil {
		return err
	}
	defer m.close()
	acquirer, err := m.callers(ctx, 1, false)
	if err != nil {
		return err
	}
	if err := acquirer[0](ctx); err != nil { // warm: connections and statements
		return err
	}
	var (
		purged int
		perr   error
		took   time.Duration
	)
	during, err := runWhile(ctx, acquirer, func() {
		start := time.Now()
		purged, perr = m.c.Locks.CleanupExpired(ctx)
		took = time.Since(start)
	})
	if err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	if purged != rows {
		return fmt.Errorf("the cleanup purged %d of %d expired locks", purged, rows)
	}
	_, idle, err := runRound(ctx, acquirer, took)
	if err != nil {
		return err
	}
	out.purges = append(out.purges, took)
	out.during = append(out.during, during...)
	out.idle = append(out.idle, idle...)
	return nil
}
