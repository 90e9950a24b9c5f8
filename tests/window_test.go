package tests

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/domain"
)

// An acquire that waits for another process's write transaction must date
// its lock from when it writes, not from when it was called: dated from
// the call, a wait longer than the TTL returned a lock already expired,
// which any other owner could take at once.
func TestAcquire_WaitsForAWriterThenDatesTheLock(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agents.db")
	mc := newMock()
	c := MustOpen(t, locks.Config{Database: path, Owner: "A", Clock: mc})

	// Another process holds SQLite's write lock.
	other, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	require.NoError(t, err)
	defer other.Close()
	tx, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.Exec("UPDATE locks SET owner_id = owner_id")
	require.NoError(t, err)

	type result struct {
		l   domain.Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.Locks.Acquire(ctx, c.Owner(), plan1, 5*time.Second)
		done <- result{l, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("acquire did not wait for the writer: %+v", r)
	case <-time.After(200 * time.Millisecond): // it is waiting in SQLite's busy handler
	}
	mc.Add(6 * time.Second) // the writer kept the lock longer than the TTL
	require.NoError(t, tx.Commit())

	r := <-done
	require.NoError(t, r.err)
	assert.False(t, r.l.ExpiredAt(mc.Now()), "the lock returned has not expired: %s, now %s", r.l.ExpiresAt, mc.Now())
	assert.Equal(t, mc.Now().Add(5*time.Second), r.l.ExpiresAt)
}
