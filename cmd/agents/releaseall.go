package main

import (
	"context"
	"fmt"
	"io"
)

// releaseAll runs "locks release-all": remove every lock of the owner,
// active or expired, and print how many.
func (c *invocation) releaseAll(ctx context.Context, args []string) error {
	if _, err := positional(args); err != nil {
		return err
	}
	owner, err := c.owner()
	if err != nil {
		return err
	}
	ctr, err := c.open(ctx, owner, false, existingOnly)
	if err != nil {
		return err
	}
	defer c.close(ctr)
	n, err := ctr.Locks.ReleaseAllForOwner(ctx, owner)
	if err != nil {
		return err
	}
	return c.emit(countDoc{Count: n}, func(w io.Writer) {
		fmt.Fprintf(w, "Released %s of owner %q.\n", plural(n, "lock"), owner)
	})
}
