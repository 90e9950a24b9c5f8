package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"

	"github.com/cleveragents/locks/adapters/entstore"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	entlock "github.com/cleveragents/locks/ent/lock"
)

// LockRepository is the lock store on SQLite: the shared store, which also
// acquires a free resource in one statement (application.OneStatement),
// where Update needs four; every other case is left to Update.
type LockRepository struct {
	*entstore.Store
	insertFree *sql.Stmt // nil on a store opened for inspection
	// insertFreeTx is insertFree in a shared transaction, whose BEGIN
	// waited for the write lock: its times are bound, read just before.
	insertFreeTx *sql.Stmt
}

var _ application.OneStatement = (*LockRepository)(nil)

// insertFreeSQL inserts a lock, which the unique index refuses when the
// resource has a row, changing nothing (not even the AUTOINCREMENT sequence,
// where ON CONFLICT DO NOTHING would leave a gap in the tokens). The token is
// the rowid, read without RETURNING (which SQLite runs through a temporary
// table); INSERT … SELECT … WHERE NOT EXISTS costs 27% more per cycle (a
// temporary table and a statement journal). Alone, the
// statement is its own transaction and takes its times from lockTime, which
// it calls once it holds the write lock; insertFreeTxSQL, in a shared
// transaction, has them bound.
var insertFreeSQL, insertFreeTxSQL = insertFreeWith(lockTimeName+"(?, 0, 0)", lockTimeName+"(?, 1, 0)"), insertFreeWith("?", "?")

func insertFreeWith(acquired, expires string) string {
	return strings.NewReplacer(
		"{locks}", entlock.Table, "{owner}", entlock.FieldOwnerID,
		"{type}", entlock.FieldResourceType, "{rid}", entlock.FieldResourceID,
		"{acquired}", entlock.FieldAcquiredAt, "{expires}", entlock.FieldExpiresAt, "{note}", entlock.FieldNote,
		"{at}", acquired, "{exp}", expires,
	).Replace("INSERT INTO `{locks}` (`{owner}`, `{type}`, `{rid}`, `{acquired}`, `{expires}`, `{note}`) VALUES (?, ?, ?, {at}, {exp}, ?)")
}

// lockTimeName is lockTime's name in SQL, registered with the driver for
// every connection in the process: one that no other code would choose.
const lockTimeName = "cleveragents_locks_time"

// lockTimeArgs is lockTime's number of arguments, the third unused: SQLite
// finds a function by its name in any case and its number of arguments,
// and a function of the same name registered with the usual two would
// otherwise be called instead on some connections.
const lockTimeArgs = 3

func init() {
	msqlite.MustRegisterScalarFunction(lockTimeName, lockTimeArgs, lockTime)
	datingKey.Store(int64(rand.Uint64() >> 2)) // keys another caller cannot guess
}

// datings holds the *dating of each insertFree under way, by its key.
var (
	datings   sync.Map
	datingKey atomic.Int64
)

// errNotOurs is lockTime's answer to a key of no insert under way.
var errNotOurs = errors.New(lockTimeName + " is the lock store's own, for its inserts alone")

// checkLockTime makes sure that lockTime answers on db's connection: a
// function of the same name in another case and arguments, registered with
// the driver by other code, would take its place and date the locks.
func checkLockTime(ctx context.Context, db *sql.DB) error {
	var v any
	err := db.QueryRowContext(ctx, "SELECT "+lockTimeName+"(0, 0, 0)").Scan(&v)
	if err != nil && strings.Contains(err.Error(), errNotOurs.Error()) {
		return nil
	}
	return fmt.Errorf("another SQL function named %s, in some case, is registered with modernc.org/sqlite in this process "+
		"and would date the store's locks: rename it (it answered %v, %v)", lockTimeName, v, err)
}

// dating is one insert's times, read from the application's clock when
// the statement first asks, which is after SQLite gave it the write lock:
// a write that waited for another process is dated when it is made. A
// lone insert thus needs no BEGIN of its own, whose transaction costs
// database/sql two goroutines and a sixth of a lone acquire's rate.
type dating struct {
	at                func() (time.Time, time.Time)
	read, panicked    bool
	panicVal          any // what at panicked with, for the caller to panic again
	acquired, expires string
}

// lockTime returns the acquired (0) or expires (1) time of the insert
// whose key is args[0]. The statement runs on its caller's goroutine.
func lockTime(_ *msqlite.FunctionContext, args []driver.Value) (_ driver.Value, err error) {
	key, _ := args[0].(int64)
	v, ok := datings.Load(key)
	if !ok {
		return nil, errNotOurs
	}
	d := v.(*dating)
	if !d.read {
		// A panic must not unwind through SQLite, which would keep its
		// write lock: the statement fails instead, and the caller panics.
		defer func() {
			if p := recover(); p != nil {
				d.panicked, d.panicVal = true, p
				err = errors.New("the clock panicked")
			}
		}()
		now, exp := d.at()
		d.acquired, d.expires, d.read = entstore.FormatTime(now), entstore.FormatTime(exp), true
	}
	if which, _ := args[1].(int64); which == 0 {
		return d.acquired, nil
	}
	return d.expires, nil
}

// newLockRepository returns s, the store of db, with its one-statement
// acquire, once db's connection answers lockTime as the store's own.
func newLockRepository(ctx context.Context, s *entstore.Store, db *DB) (*LockRepository, error) {
	if err := checkLockTime(ctx, db.wsql); err != nil {
		return nil, &domain.StoreError{Op: "open", Kind: domain.StoreInternal, Permanent: true, Err: err}
	}
	st, err := db.wsql.PrepareContext(ctx, insertFreeSQL)
	if err != nil {
		return nil, db.formatError("prepare statements", err)
	}
	tx, err := db.wsql.PrepareContext(ctx, insertFreeTxSQL)
	if err != nil {
		st.Close()
		return nil, db.formatError("prepare statements", err)
	}
	return &LockRepository{Store: s, insertFree: st, insertFreeTx: tx}, nil
}

// Close releases the prepared statements.
func (s *LockRepository) Close() error {
	if s.insertFree == nil {
		return s.Store.Close()
	}
	return errors.Join(s.insertFree.Close(), s.insertFreeTx.Close(), s.Store.Close())
}

// inserted is the outcome of one run of acquireAt's write.
type inserted struct {
	ok                bool // false: the resource has a row
	token             int64
	acquired, expires string
}

// insert runs insertFree alone, dated by lockTime, or insertFreeTx in tx.
func (s *LockRepository) insert(ctx context.Context, tx *sql.Tx, ref domain.ResourceRef, owner, note string,
	at func() (time.Time, time.Time)) (in inserted, res sql.Result, err error) {
	if tx != nil {
		now, exp := at()
		in.acquired, in.expires = entstore.FormatTime(now), entstore.FormatTime(exp)
		res, err = s.On(ctx, tx, s.insertFreeTx).ExecContext(ctx,
			owner, string(ref.Type), ref.ID, in.acquired, in.expires, entstore.NoteValue(note))
		return in, res, err
	}
	d := &dating{at: at}
	key := datingKey.Add(1)
	datings.Store(key, d)
	defer datings.Delete(key)
	res, err = s.insertFree.ExecContext(ctx, owner, string(ref.Type), ref.ID, key, key, entstore.NoteValue(note))
	if d.panicked {
		panic(d.panicVal)
	}
	return inserted{acquired: d.acquired, expires: d.expires}, res, err
}

// Apply implements application.OneStatement: AcquireAt for an acquire or a
// take, which it only ever inserts into a free resource; not a renewal.
func (s *LockRepository) Apply(ctx context.Context, op application.Op) (application.Outcome, error) {
	if op.Kind != application.OpAcquire && op.Kind != application.OpTake {
		return application.Outcome{}, nil
	}
	return s.acquireAt(ctx, op.Ref, op.Owner, op.Note, op.At)
}

// AcquireAt inserts the lock if the resource has no row, and otherwise
// leaves it to Update (ChangeNone), at once for one just refused.
func (s *LockRepository) AcquireAt(ctx context.Context, ref domain.ResourceRef, owner string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	return s.acquireAt(ctx, ref, owner, "", at)
}

// acquireAt is AcquireAt storing note with the lock.
func (s *LockRepository) acquireAt(ctx context.Context, ref domain.ResourceRef, owner, note string, at func() (time.Time, time.Time)) (application.Outcome, error) {
	if s.insertFree == nil || s.Contended().Has(ref) {
		return application.Outcome{}, nil
	}
	ins, err := entstore.WriteOne(ctx, s.Store, entstore.OneStatement, func(ctx context.Context, tx *sql.Tx) (inserted, error) {
		in, res, err := s.insert(ctx, tx, ref, owner, note, at)
		if err != nil {
			if isDuplicate(err) {
				return inserted{}, nil // the resource has a row: Update decides
			}
			return inserted{}, err
		}
		if in.acquired == "" {
			return inserted{}, errors.New("the lock was inserted without its times") // SQLite skipped lockTime
		}
		in.token, err = res.LastInsertId()
		in.ok = err == nil
		return in, err
	})
	if err != nil {
		return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
	}
	if !ins.ok {
		return application.Outcome{}, nil
	}
	l := domain.Lock{Token: ins.token, Owner: owner, Resource: ref, Note: note}
	if err := entstore.ParseTimes(&l, ins.acquired, ins.expires); err != nil {
		return application.Outcome{}, s.Failed(ctx, err, "acquire lock on", ref)
	}
	return application.Outcome{Kind: application.ChangeInsert, Lock: l}, nil
}
