package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// completionDeadline bounds the read of the resource ids that completion
// offers: a shell waits for it at every Tab.
const completionDeadline = time.Second

// resourceTypes are the values of TYPE, as completion offers them.
var resourceTypes = []string{string(domain.ResourcePlan), string(domain.ResourceProject)}

// completions registers the shell completion of a command's arguments and
// flags: TYPE, then the ids of the resources of that type that the
// database holds locks on, for the commands that take them; the types for
// --type.
func (c *invocation) completions(cc *cobra.Command) {
	if strings.Contains(cc.Use, "TYPE ID") {
		cc.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			switch {
			case len(args) >= 2:
				// CMD of locks run and its arguments: the shell's own.
				if cmd.Name() == "run" {
					return nil, cobra.ShellCompDirectiveDefault
				}
				return nil, cobra.ShellCompDirectiveNoFileComp
			case len(args) == 0:
				return withPrefix(resourceTypes, toComplete), cobra.ShellCompDirectiveNoFileComp
			}
			return withPrefix(c.resourceIDs(cmd.Context(), domain.ResourceType(args[0])), toComplete), cobra.ShellCompDirectiveNoFileComp
		}
	}
	if cc.Flags().Lookup("type") != nil {
		_ = cc.RegisterFlagCompletionFunc("type", cobra.FixedCompletions(resourceTypes, cobra.ShellCompDirectiveNoFileComp))
	}
}

// resourceIDs returns the ids of the resources of type t that the lock
// database holds locks on, expired or not. It reads the database as list
// does, read-only, within completionDeadline, and creates nothing: a
// database that does not exist, or cannot be read in time, offers none.
func (c *invocation) resourceIDs(ctx context.Context, t domain.ResourceType) []string {
	if !t.Valid() {
		return nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionDeadline)
	defer cancel()
	db, _, err := c.database()
	if err != nil {
		return nil
	}
	ro, err := c.openReadOnly(ctx, db)
	if err != nil {
		return nil
	}
	defer ro.close()
	if c.requireSchema(ctx, ro, db) != nil {
		return nil
	}
	svc, err := application.NewLockService(ro.repo, c.clock, 0)
	if err != nil {
		return nil
	}
	ls, err := svc.List(ctx, application.ListOptions{Type: t, IncludeExpired: true})
	if err != nil {
		return nil
	}
	ids := make([]string, 0, len(ls))
	for _, l := range ls {
		ids = append(ids, l.Resource.ID)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// withPrefix returns the words that begin with prefix.
func withPrefix(words []string, prefix string) []string {
	var out []string
	for _, w := range words {
		if strings.HasPrefix(w, prefix) {
			out = append(out, w)
		}
	}
	return out
}

// plainUsages removes, for a completion request, the backquotes with
// which a flag's usage names its value (pflag.UnquoteUsage): cobra shows
// the usage as the flag's description, and the shell would show them.
func plainUsages(root *cobra.Command) {
	var walk func(cmd *cobra.Command)
	plain := func(f *pflag.Flag) { _, f.Usage = pflag.UnquoteUsage(f) }
	walk = func(cmd *cobra.Command) {
		cmd.LocalNonPersistentFlags().VisitAll(plain)
		cmd.PersistentFlags().VisitAll(plain)
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
