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
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The application writes its own table in the lock file through the
// container, so that its transactions queue with the lock service's own
// writes (renewals among them), and fences them as a plan store does.
func ExampleContainer_Write() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "write")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	mc := clock.NewMock()
	c, err := locks.Open(ctx, locks.Config{Database: filepath.Join(dir, "agents.db"), Clock: mc})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE plans (id TEXT PRIMARY KEY, phase TEXT)`)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	write := func(lock domain.Lock, phase string) error {
		return c.Write(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if err := c.CheckFence(ctx, tx, application.FenceOf(lock)); err != nil {
				return err // rolled back: nothing written
			}
			_, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO plans VALUES ('plan-42', ?)`, phase)
			return err
		})
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
	var lost *domain.LockLostError
	if err := write(held, "stale"); errors.As(err, &lost) {
		fmt.Println("worker-1 refused:", lost.Reason, "by", lost.NewHolder.Owner)
	}
	// Output:
	// worker-1 writes: <nil>
	// worker-1 refused: taken over by worker-2
}
