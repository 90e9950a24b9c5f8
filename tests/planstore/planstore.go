// Package planstore is a reference SQL plan store for
// application.PlanLifecycleService: a small plans table in the same
// database as the locks, whose Persist checks every fence inside its own
// transaction before it writes. It is test and example code
// (docs/lifecycle.md): an embedder keeps its plans in its own schema, and
// the module migrates only its locks table.
package planstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Plan is the example's plan: a phase, a counter that transitions
// increment, and the fencing token of the plan lock it was last persisted
// under.
type Plan struct {
	ID      string
	Phase   string
	Counter int64
	Token   int64
}

// The plans table: columns named once, so that a typo breaks the build.
const (
	table        = "plans"
	columnID     = "id"
	columnPhase  = "phase"
	columnCount  = "counter"
	columnFenced = "fence_token"
)

// createTable is portable between SQLite and PostgreSQL.
const createTable = `CREATE TABLE IF NOT EXISTS ` + table + ` (
	` + columnID + ` VARCHAR(255) PRIMARY KEY,
	` + columnPhase + ` VARCHAR(50) NOT NULL,
	` + columnCount + ` BIGINT NOT NULL,
	` + columnFenced + ` BIGINT NOT NULL
)`

// ErrNoPlan: there is no plan with the id asked for.
var ErrNoPlan = errors.New("no such plan; create it first")

// FenceFunc checks one fence inside tx; (*locks.Container).CheckFence is
// one.
type FenceFunc func(ctx context.Context, tx locks.Querier, f application.Fence) error

// Store implements application.PlanStore[Plan] over the plans table.
type Store struct {
	db      *sql.DB
	dialect string
	fence   FenceFunc
	own     bool // Close closes db
}

var _ application.PlanStore[Plan] = (*Store)(nil)

// Open opens database, as given to locks.Config.Database (a SQLite file or
// a PostgreSQL DSN), for the plans, and creates the plans table if it is
// missing. On SQLite it uses the lock store's connection settings
// (sqlite.DSN): WAL, a busy timeout, so that a write waits for the lock
// service's, and write transactions that take the write lock at BEGIN.
func Open(ctx context.Context, database string, fence FenceFunc) (*Store, error) {
	driver, dsn, d := "pgx", database, dialect.Postgres
	if !locks.IsPostgres(database) {
		var err error
		if dsn, err = sqlite.DSN(database, 0); err != nil {
			return nil, err
		}
		driver, d = "sqlite", dialect.SQLite
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	s := New(db, d, fence)
	s.own = true
	if err := s.CreateTable(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// New returns the store over db, a database of dialectName (Ent's
// dialect.SQLite or dialect.Postgres), whose Persist checks fences with
// fence.
func New(db *sql.DB, dialectName string, fence FenceFunc) *Store {
	return &Store{db: db, dialect: dialectName, fence: fence}
}

// DB returns the store's database.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the database if Open opened it.
func (s *Store) Close() error {
	if s.own {
		return s.db.Close()
	}
	return nil
}

// CreateTable creates the plans table if it is missing.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, createTable)
	return err
}

// Create stores a new plan.
func (s *Store) Create(ctx context.Context, p Plan) error {
	query, args := entsql.Dialect(s.dialect).Insert(table).
		Columns(columnID, columnPhase, columnCount, columnFenced).
		Values(p.ID, p.Phase, p.Counter, p.Token).
		Query()
	_, err := s.db.ExecContext(ctx, query, args...)
	return err
}

// Load implements application.PlanStore.
func (s *Store) Load(ctx context.Context, planID string) (Plan, error) {
	b := entsql.Dialect(s.dialect)
	query, args := b.Select(columnID, columnPhase, columnCount, columnFenced).
		From(b.Table(table)).
		Where(entsql.EQ(columnID, planID)).
		Query()
	var p Plan
	err := s.db.QueryRowContext(ctx, query, args...).Scan(&p.ID, &p.Phase, &p.Counter, &p.Token)
	if errors.Is(err, sql.ErrNoRows) {
		return Plan{}, fmt.Errorf("load plan %q: %w", planID, ErrNoPlan)
	}
	return p, err
}

// Persist implements application.PlanStore: in one transaction, it checks
// every fence in order, then writes the plan, with the token of the plan's
// own fence. A fence that does not hold ends the transaction, and nothing
// is written.
func (s *Store) Persist(ctx context.Context, planID string, p Plan, fences []application.Fence) (err error) {
	tx, err := s.db.BeginTx(ctx, s.txOptions())
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ignoreDone(tx.Rollback()))
		}
	}()
	var token int64
	for _, f := range fences {
		if err := s.fence(ctx, tx, f); err != nil {
			return err
		}
		if f.Resource == (domain.ResourceRef{Type: domain.ResourcePlan, ID: planID}) {
			token = f.Token
		}
	}
	query, args := entsql.Dialect(s.dialect).Update(table).
		Set(columnPhase, p.Phase).
		Set(columnCount, p.Counter).
		Set(columnFenced, token).
		Where(entsql.EQ(columnID, planID)).
		Query()
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.Join(fmt.Errorf("persist plan %q: %w", planID, ErrNoPlan), err)
	}
	return tx.Commit()
}

// txOptions are those of Persist's transaction: on PostgreSQL, READ
// COMMITTED, as the fence expects (postgres.CheckFence); SQLite has one
// level.
func (s *Store) txOptions() *sql.TxOptions {
	if s.dialect == dialect.Postgres {
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

// ignoreDone drops the error of rolling back a transaction that already
// ended.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
