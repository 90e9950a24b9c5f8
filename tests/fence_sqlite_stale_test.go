package tests

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Through Container.CheckFence, a lost lock is reported as lost, never as
// a stale snapshot, and a held one as Held. On SQLite, a deferred
// transaction that read first cannot take the write lock
// (SQLITE_BUSY_SNAPSHOT): the container reads the lock outside the
// transaction, as on PostgreSQL, so that a lock another owner has taken
// over, or that was released, is a LockLostError (ErrExpired), and a lock
// still held is a StaleSnapshotError with Held.
func TestCheckFence_SQLiteStaleSnapshotReadsTheLock(t *testing.T) {
	for _, sc := range []string{"taken over", "released", "renewed (held)"} {
		t.Run(sc, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "agents.db")
			mock := clock.NewMock()
			mock.Set(time.Now())
			c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "a", Clock: mock})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			app, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=5000") // a plain, deferred DSN
			if err != nil {
				t.Fatal(err)
			}
			defer app.Close()
			if _, err := app.Exec("CREATE TABLE app(x)"); err != nil {
				t.Fatal(err)
			}
			ref := domain.ResourceRef{Type: domain.ResourcePlan, ID: "f"}
			l, err := c.Locks.Acquire(ctx, "a", ref, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := app.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var n int
			if err := tx.QueryRow("SELECT count(*) FROM app").Scan(&n); err != nil { // read first
				t.Fatal(err)
			}
			switch sc {
			case "taken over":
				mock.Add(6 * time.Second)
				if _, err := c.Locks.Acquire(ctx, "b", ref, 5*time.Second); err != nil {
					t.Fatal(err)
				}
			case "released":
				if _, err := c.Locks.Release(ctx, "a", ref); err != nil {
					t.Fatal(err)
				}
			case "renewed (held)":
				if _, err := c.Locks.Renew(ctx, "a", ref, 5*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			err = c.CheckFence(ctx, tx, application.FenceOf(l))
			var stale *domain.StaleSnapshotError
			var lost *domain.LockLostError
			switch sc {
			case "renewed (held)":
				if !errors.As(err, &stale) || !stale.Held {
					t.Fatalf("the lock is held by the fence's owner, token %d: want a StaleSnapshotError with Held, got Held=%v: %v",
						l.Token, stale != nil && stale.Held, err)
				}
			default:
				if !errors.As(err, &lost) {
					t.Fatalf("the fence's lock is %s (another owner holds it or it is free), but CheckFence says "+
						"(StaleSnapshotError=%v, ErrExpired=%v, ErrUnavailable=%v): %v",
						sc, errors.As(err, &stale), errors.Is(err, domain.ErrExpired), errors.Is(err, domain.ErrUnavailable), err)
				}
			}
		})
	}
}
