package tests

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Review (promise 2, nested lock calls inside fn): Container.Write's doc
// says a lock call made inside fn "would wait for fn's own transaction,
// and fails instead". It fails only when fn passes the ctx it was given.
// The ordinary closure that captures the caller's ctx (or any other
// context) is not detected: the call queues behind fn's own transaction,
// which cannot finish until the call returns, so Write hangs until that
// context ends, holding SQLite's only write lock all the while (every
// renewal of every process waits for it).
func TestReview_WriteNestedAcquireWithOuterContextDeadlocks(t *testing.T) {
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: filepath.Join(t.TempDir(), "agents.db"), Owner: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	outer, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	start := time.Now()
	var acqErr error
	werr := c.Write(outer, func(_ context.Context, tx *sql.Tx) error {
		_, acqErr = c.Locks.Acquire(outer, c.Owner(), domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, 0)
		return acqErr
	})
	took := time.Since(start)
	t.Logf("Write returned after %v: %v (nested Acquire: %v)", took.Round(time.Millisecond), werr, acqErr)
	if took > 2*time.Second {
		t.Fatalf("a lock call inside Write's fn, made with the caller's context, was not refused: it waited %v "+
			"(until the context ended) for fn's own transaction; acquire error: %v", took.Round(time.Millisecond), acqErr)
	}
}

// The same hang holds the file's only write lock: a 5 s lock kept alive by
// another container on the file (another process) is lost meanwhile.
func TestReview_WriteNestedAcquireStarvesOtherProcessKeepAlive(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other, err := locks.Open(ctx, locks.Config{Database: path, Owner: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	h, err := other.Locks.Take(ctx, "other", domain.ResourceRef{Type: domain.ResourcePlan, ID: "kept"},
		application.AcquireOptions{TTL: domain.MinLockTTL})
	if err != nil {
		t.Fatal(err)
	}
	held := h.KeepAlive(ctx)
	outer, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	_ = c.Write(outer, func(_ context.Context, tx *sql.Tx) error {
		_, err := c.Locks.Acquire(outer, c.Owner(), domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"}, 0)
		return err
	})
	select {
	case <-held.Done():
		t.Fatalf("another container's kept-alive 5 s lock was lost while Write's fn waited for its own nested Acquire: %v",
			context.Cause(held))
	case <-time.After(2 * time.Second):
	}
}
