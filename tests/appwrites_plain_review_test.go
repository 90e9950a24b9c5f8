package tests

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// Review (promise 2, "the app writing through its own plain *sql.DB as
// older docs said"): docs/lifecycle.md still says a *sql.DB of the
// application's own on sqlite.DSN is where "an occasional write ... is
// safe". A stream of back-to-back 3 ms transactions there (what the docs
// used to recommend) still starves the keep-alive of a 5 s lock.
func TestReview_PlainDBWriteStreamLosesKeptAliveLock(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	c, err := locks.Open(ctx, locks.Config{Database: path, Owner: "app"})
	require.NoError(t, err)
	defer c.Close()
	app := openApplication(t, path)
	h, err := c.Locks.Take(ctx, "app", domain.ResourceRef{Type: domain.ResourcePlan, ID: "p1"},
		application.AcquireOptions{TTL: domain.MinLockTTL})
	require.NoError(t, err)
	held := h.KeepAlive(ctx)
	stop := time.After(40 * time.Second)
	start := time.Now()
	writes := 0
	for {
		select {
		case <-held.Done():
			t.Fatalf("kept-alive 5 s lock lost after %v and %d writes on the application's own *sql.DB: %v",
				time.Since(start).Round(time.Millisecond), writes, context.Cause(held))
		case <-stop:
			return
		default:
		}
		tx, err := app.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.Exec("INSERT INTO app (note) VALUES ('x')")
		require.NoError(t, err)
		time.Sleep(3 * time.Millisecond)
		require.NoError(t, tx.Commit())
		writes++
	}
}
