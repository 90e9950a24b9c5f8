package tests

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/tests/testdb"
)

// A waiter in one container on PostgreSQL (another process, possibly on
// another host) is woken by a release in another container through the
// server's notification. Both run on a mock clock that the test never
// moves, so that neither the waiter's fallback read nor a backoff can
// find the lock free instead: the Take returns only if the wake-up came.
func TestTake_WokenAcrossContainersOnPostgres(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t)
	mc := newMock()
	procA := MustOpen(t, locks.Config{Database: dsn, Owner: "A", Clock: mc, LocalTime: true})
	procB := MustOpen(t, locks.Config{Database: dsn, Owner: "B", Clock: mc, LocalTime: true})
	held, err := procA.Locks.Take(ctx, "A", plan1, application.AcquireOptions{TTL: time.Hour})
	require.NoError(t, err)

	// B announces on the store's channel that it watches plan1 once it
	// waits: hear it, so that A releases while B sleeps.
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	listen, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer listen.Close(ctx)
	_, err = listen.Exec(ctx, `LISTEN "cleveragents_locks.`+u.Query().Get("search_path")+`"`)
	require.NoError(t, err)

	type result struct {
		h   *application.Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := procB.Locks.Take(ctx, "B", plan1, application.AcquireOptions{TTL: time.Hour, Wait: true})
		done <- result{h, err}
	}()
	heard, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		n, err := listen.WaitForNotification(heard)
		require.NoError(t, err, "B never announced that it waits")
		if strings.HasPrefix(n.Payload, "+") && strings.HasSuffix(n.Payload, ":"+string(plan1.Type)+":"+plan1.ID) {
			break
		}
	}

	_, err = held.Release(ctx)
	require.NoError(t, err)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		assert.Equal(t, "B", r.h.Lock().Owner)
		_, err = r.h.Release(ctx)
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter in the other container was not woken by the release")
	}
}
