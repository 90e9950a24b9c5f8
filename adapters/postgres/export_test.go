package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cleveragents/locks/domain"
)

// ReadOnlySession reports whether the connections of db refuse to write:
// a write sent straight to the server, past the store, fails with
// read_only_sql_transaction.
func ReadOnlySession(t *testing.T, db *DB) bool {
	t.Helper()
	_, err := db.sql.Exec("CREATE TABLE locks_write_probe (id int)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("a write through an inspection connection: %v, want SQLSTATE 25006", err)
		return false
	}
	return true
}

// SessionIsolation returns the isolation level of a statement sent
// through db outside any transaction: the session's default.
func SessionIsolation(t *testing.T, db *DB) string {
	t.Helper()
	var level string
	if err := db.sql.QueryRow("SELECT current_setting('transaction_isolation')").Scan(&level); err != nil {
		t.Fatalf("reading the isolation level: %v", err)
	}
	return level
}

// Setting returns the value of the setting name on a connection of db's
// pool.
func Setting(t *testing.T, db *DB, name string) string {
	t.Helper()
	var v string
	if err := db.sql.QueryRow("SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	return v
}

// ResourceKey is the key of a resource's advisory lock, for tests that hold
// it to make a write wait.
var ResourceKey = resourceKey

// Measure measures c's offset to the server now, as its background
// refresh does every ClockRefresh.
func Measure(ctx context.Context, c *ServerClock) error { return c.measure(ctx) }

// ListenerPID returns the backend PID of db's listener connection, 0
// while it is not listening.
func ListenerPID(db *DB) uint32 {
	db.wake.mu.Lock()
	defer db.wake.mu.Unlock()
	return db.wake.pid
}

// Watching reports whether db's listener holds the watch lock of ref: a
// release of ref notifies from then on.
func Watching(db *DB, ref domain.ResourceRef) bool {
	db.wake.mu.Lock()
	defer db.wake.mu.Unlock()
	return db.wake.held[ref]
}

// Channel returns the notification channel of db.
func Channel(db *DB) string { return db.wake.channel }

// ReleaseSQL returns what db runs for the release statement del.
func ReleaseSQL(db *DB, del string) string { return releaseStatement(db.wake.channel)(del) }

// RemoteTTL is how long another process's mark stands unannounced.
const RemoteTTL = remoteTTL

// AgeMarks moves the time that db's listener stamps and ages the others'
// marks by d.
func AgeMarks(db *DB, d time.Duration) {
	db.wake.mu.Lock()
	defer db.wake.mu.Unlock()
	now := db.wake.now
	db.wake.now = func() time.Time { return now().Add(d) }
}

// AwaitListener waits until cond holds, testing it again at every change
// of db's listener (a connect, a drop, a notification), and fails the
// test if it does not within a generous bound.
func AwaitListener(t *testing.T, db *DB, what string, cond func() bool) {
	t.Helper()
	bound := time.After(30 * time.Second)
	for {
		db.wake.mu.Lock()
		changed := db.wake.changed
		db.wake.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-bound:
			t.Fatalf("waited 30 s for %s", what)
		}
	}
}

// MaxWatched bounds the resources a process watches at once.
const MaxWatched = maxWatched

// WatchClass is the first key of the watch locks.
const WatchClass = watchClass

// Write is the store's Backend.Write: it runs fn, again when it may.
func Write(ctx context.Context, fn func(context.Context) error) error { return write(ctx, fn) }

// SessionEnded is the test of a read's failure that runs it again.
func SessionEnded(err error) bool { return sessionEnded(err) }

// BatchStatements returns the batch statements by name, as a store that
// reads the server's clock runs them (the release without wake-ups).
func BatchStatements() map[string]string {
	return map[string]string{
		"free":    acquireFreeBatchSQL,
		"acquire": acquireBatchSQL[0],
		"take":    takeBatchSQL[0],
		"renew":   renewBatchSQL,
		"release": releaseBatch(nil, ""),
	}
}
