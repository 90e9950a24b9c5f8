package main

import (
	"context"
	"fmt"
	"io"
)

// cleanup runs "locks cleanup": purge the expired locks and print how many.
// It opens the store without the startup cleanup, which would purge them
// first: an operator who saw "2 stale locks" in diagnostics must see
// cleanup report 2.
func (c *invocation) cleanup(ctx context.Context, args []string) error {
	if _, err := positional(args); err != nil {
		return err
	}
	ctr, err := c.open(ctx, "", true, existingOnly)
	if err != nil {
		return err
	}
	defer c.close(ctr)
	n, err := ctr.Locks.CleanupExpired(ctx)
	if err != nil {
		return err
	}
	return c.emit(countDoc{Count: n}, func(w io.Writer) {
		if n == 0 {
			fmt.Fprintln(w, "No expired locks to purge.")
			return
		}
		fmt.Fprintf(w, "Purged %s.\n", plural(n, "expired lock"))
	})
}
