package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// listedLock is a lock in the JSON output of list.
type listedLock struct {
	lockDoc
	Expired bool `json:"expired"`
}

// list runs "locks list [--type T] [--owner O] [--all]": the active locks,
// with --all the expired ones not yet purged too, marked as such.
//
// Only the --owner flag filters: AGENTS_OWNER says who acts, and an
// operator with it set still wants to see who holds what.
func (c *invocation) list(ctx context.Context, args []string) error {
	if _, err := positional(args); err != nil {
		return err
	}
	typ, all := &c.listType, &c.listAll
	opts := application.ListOptions{Type: domain.ResourceType(*typ), IncludeExpired: *all}
	if opts.Type != "" && !opts.Type.Valid() {
		return usagef("--type %q is not a resource type; use %q or %q", *typ, domain.ResourcePlan, domain.ResourceProject)
	}
	if c.g.ownerSet {
		opts.Owner = c.g.owner
		if err := domain.ValidateOwner(opts.Owner); err != nil {
			return err
		}
	}
	// Read-only, like diagnostics: listing creates, migrates and purges
	// nothing, works on a file this user cannot write, and never waits for
	// a writer. Without --all the service leaves the expired locks out.
	db, _, err := c.database()
	if err != nil {
		return err
	}
	ro, err := c.openReadOnly(ctx, db)
	if err != nil {
		return err
	}
	defer ro.close()
	if err := c.requireSchema(ctx, ro, db); err != nil {
		return err
	}
	svc, err := application.NewLockService(ro.repo, c.clock, 0)
	if err != nil {
		return err
	}
	ls, err := svc.List(ctx, opts)
	if err != nil {
		return err
	}
	now := svc.Now()
	docs := make([]listedLock, 0, len(ls))
	for _, l := range ls {
		docs = append(docs, listedLock{lockDoc: newLockDoc(l), Expired: l.ExpiredAt(now)})
	}
	return c.emit(docs, func(w io.Writer) {
		if len(ls) == 0 {
			if *all {
				fmt.Fprintln(w, "No locks.")
			} else {
				fmt.Fprintln(w, "No active locks.")
			}
			return
		}
		// A NOTE column only when a lock has one: the table of locks
		// without notes stays as it was.
		notes := slices.ContainsFunc(ls, func(l domain.Lock) bool { return l.Note != "" })
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		header := "TYPE\tID\tOWNER\tTOKEN\tACQUIRED\tEXPIRES\tSTATUS"
		if notes {
			header += "\tNOTE"
		}
		fmt.Fprintln(tw, header)
		for _, l := range ls {
			status := "active"
			if l.ExpiredAt(now) {
				status = "EXPIRED"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s", l.Resource.Type, printable(l.Resource.ID), printable(l.Owner), l.Token,
				c.when(l.AcquiredAt, now), c.when(l.ExpiresAt, now), status)
			if notes {
				fmt.Fprintf(tw, "\t%s", printable(l.Note))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	})
}
