package locks_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// An application container opens the module once, at startup, and closes it
// at shutdown; Close releases whatever the owner still holds.
func Example() {
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{
		Database: locks.MemoryDatabase, // a SQLite file path in production
		Owner:    "worker-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-42"}
	lock, err := c.Locks.Acquire(ctx, c.Owner(), plan, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held by", lock.Owner, "with token", lock.Token, "for", lock.ExpiresAt.Sub(lock.AcquiredAt))

	// ... change the plan, passing lock.Token along as a fencing token ...

	released, err := c.Locks.Release(ctx, c.Owner(), plan)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("released:", released)
	// Output:
	// held by worker-1 with token 1 for 5m0s
	// released: true
}

// A second owner is refused while the lock is active, with the holder's
// details, and takes over transparently once it has expired. A mock clock
// makes the expiry happen without waiting.
func Example_conflict() {
	ctx := context.Background()
	mc := clock.NewMock()
	c, err := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase, Clock: mc})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	project := domain.ResourceRef{Type: domain.ResourceProject, ID: "apollo"}

	if _, err := c.Locks.Acquire(ctx, "alice", project, 30*time.Second); err != nil {
		log.Fatal(err)
	}
	mc.Add(10 * time.Second)
	_, err = c.Locks.Acquire(ctx, "bob", project, 0)
	var conflict *domain.LockConflictError
	if errors.As(err, &conflict) {
		fmt.Println("held by", conflict.Holder.Owner, "for another", conflict.Holder.Remaining(conflict.Now))
	}

	mc.Add(20 * time.Second) // alice's lock expires: bob takes over
	lock, err := c.Locks.Acquire(ctx, "bob", project, 0)
	fmt.Println(lock.Owner, lock.Token, err)
	// Output:
	// held by alice for another 20s
	// bob 2 <nil>
}

// Long work renews its lock every half TTL; a holder whose lock expired
// learns it from Renew and must acquire again.
func Example_renew() {
	ctx := context.Background()
	mc := clock.NewMock()
	c, err := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase, Clock: mc})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "execute-phase"}
	ttl := time.Minute

	if _, err := c.Locks.Acquire(ctx, c.Owner(), plan, ttl); err != nil {
		log.Fatal(err)
	}
	for range 3 {
		mc.Add(domain.RenewInterval(ttl))
		if _, err := c.Locks.Renew(ctx, c.Owner(), plan, ttl); err != nil {
			log.Fatal(err)
		}
	}
	mc.Add(2 * ttl) // the process stalls past its TTL
	_, err = c.Locks.Renew(ctx, c.Owner(), plan, ttl)
	fmt.Println(errors.Is(err, domain.ErrExpired))
	// Output:
	// true
}

// Work that outlasts a TTL runs under Do: it waits for the lock, keeps it
// alive while the function runs, and releases it afterwards; the
// function's context ends the moment the lock is lost.
func Example_do() {
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: locks.MemoryDatabase, Owner: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-42"}

	err = c.Locks.Do(ctx, c.Owner(), plan, application.AcquireOptions{Wait: true, Timeout: time.Minute},
		func(ctx context.Context, lock domain.Lock) error {
			fmt.Println("executing under token", lock.Token)
			return ctx.Err() // nil: the lock is still held
		})
	fmt.Println("done:", err)
	_, err = c.Locks.Get(ctx, plan)
	fmt.Println("released:", errors.Is(err, domain.ErrNotFound))
	// Output:
	// executing under token 1
	// done: <nil>
	// released: true
}

// A write that must only land while its lock is held checks the lock's
// fence inside the writer's own transaction, on the database that holds
// the locks: a holder that stalled past its expiry while another owner
// took the lock over is refused, and rolls back. A mock clock makes the
// stall.
func ExampleContainer_CheckFence() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fence")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	database := filepath.Join(dir, "agents.db")
	mc := clock.NewMock()
	c, err := locks.Open(ctx, locks.Config{Database: database, Clock: mc})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The application's own table, in the same SQLite file as the locks,
	// written through a connection of its own (sqlite.DSN: WAL, a busy
	// timeout, immediate transactions).
	dsn, err := sqlite.DSN(database, 0)
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE plans (id TEXT PRIMARY KEY, phase TEXT)`); err != nil {
		log.Fatal(err)
	}
	write := func(lock domain.Lock, phase string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := c.CheckFence(ctx, tx, application.FenceOf(lock)); err != nil {
			return err // nothing written: roll back
		}
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO plans VALUES ('plan-42', ?)`, phase); err != nil {
			return err
		}
		return tx.Commit()
	}

	ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "plan-42"}
	held, err := c.Locks.Acquire(ctx, "worker-1", ref, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("worker-1 writes:", write(held, "execute"))

	mc.Add(2 * time.Minute) // worker-1 stalls; its lock expires
	if _, err := c.Locks.Acquire(ctx, "worker-2", ref, time.Minute); err != nil {
		log.Fatal(err)
	}
	err = write(held, "stale")
	var lost *domain.LockLostError
	if errors.As(err, &lost) {
		fmt.Println("worker-1 refused:", lost.Reason, "by", lost.NewHolder.Owner)
	}
	var phase string
	if err := db.QueryRowContext(ctx, `SELECT phase FROM plans`).Scan(&phase); err != nil {
		log.Fatal(err)
	}
	fmt.Println("the plan is", phase)
	// Output:
	// worker-1 writes: <nil>
	// worker-1 refused: taken over by worker-2
	// the plan is execute
}
