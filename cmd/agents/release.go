package main

import (
	"context"
	"fmt"
	"io"

	"github.com/cleveragents/locks/domain"
)

// releaseDoc is the JSON output of release.
type releaseDoc struct {
	Released     bool   `json:"released"`
	OwnerID      string `json:"owner_id"`
	ResourceType string `json:"resource_type"`
	ResourceID   string `json:"resource_id"`
	// Holder is the active lock of another owner on the resource, when
	// nothing was released because of it: releasing under the wrong owner
	// is the usual slip.
	Holder *lockDoc `json:"holder,omitempty"`
}

// release runs "locks release TYPE ID": remove the owner's lock, active or
// expired, and say whether there was one. Another owner's lock is never
// touched, and releasing nothing is not an error (exit 0).
func (c *invocation) release(ctx context.Context, args []string) error {
	ctr, ref, owner, err := c.openTarget(ctx, args, false)
	if err != nil {
		return err
	}
	defer c.close(ctr)
	released, err := ctr.Locks.Release(ctx, owner, ref)
	if err != nil {
		return err
	}
	// Releasing under the wrong owner is the usual slip: name the holder.
	// This is only a hint, so a failure to read it is not reported. A lock
	// of the same owner cannot be found here: it would have been released.
	var holder *domain.Lock
	if !released {
		if l, err := ctr.Locks.Get(ctx, ref); err == nil && !l.ExpiredAt(ctr.Locks.Now()) {
			holder = &l
		}
	}
	doc := releaseDoc{Released: released, OwnerID: owner, ResourceType: string(ref.Type), ResourceID: ref.ID}
	if holder != nil {
		h := newLockDoc(*holder)
		doc.Holder = &h
	}
	return c.emit(doc, func(w io.Writer) {
		res := printable(ref.String())
		switch {
		case released:
			fmt.Fprintf(w, "Released %s, held by owner %q.\n", res, owner)
		case holder != nil:
			fmt.Fprintf(w, "Nothing released: %s is held by owner %q, not by %q; only its holder can release it.\n", res, holder.Owner, owner)
		default:
			fmt.Fprintf(w, "Nothing released: owner %q holds no lock on %s.\n", owner, res)
		}
	})
}
