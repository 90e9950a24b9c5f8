package cli

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
)

// envHoldWriteLock makes the test binary hold the write lock of the SQLite
// database it names (BEGIN IMMEDIATE), print "holding", and keep it until
// its stdin ends: another process in the middle of a write transaction.
const envHoldWriteLock = "AGENTS_TEST_HOLD_WRITE_LOCK"

func holdWriteLock(db string) int {
	ctx := context.Background()
	sdb, err := sql.Open("sqlite", db)
	if err == nil {
		var conn *sql.Conn
		if conn, err = sdb.Conn(ctx); err == nil {
			if _, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err == nil {
				fmt.Println("holding")
				_, _ = io.Copy(io.Discard, os.Stdin)
				_, err = conn.ExecContext(ctx, "ROLLBACK")
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
