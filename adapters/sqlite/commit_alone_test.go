package sqlite

import (
	"testing"

	"github.com/cleveragents/locks/adapters/entstore"
)

// TestCommitter_AloneOnlyWhenNoOtherCallIsInRun: a lone statement is a
// commit of its own, so it runs alone only when no other call could share
// it. A call queued alone while the callers of the last batch are still
// returning (and about to write again) goes into a transaction that
// gathers them.
func TestCommitter_AloneOnlyWhenNoOtherCallIsInRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kinds []entstore.WriteKind
		busy  bool
		calls int32
		want  bool
	}{
		{"OneCallerOneStatement", []entstore.WriteKind{entstore.OneStatement}, false, 1, true},
		{"OthersStillReturning", []entstore.WriteKind{entstore.OneStatement}, false, 5, false},
		{"AfterASharedBatch", []entstore.WriteKind{entstore.OneStatement}, true, 1, false},
		{"TwoQueued", []entstore.WriteKind{entstore.OneStatement, entstore.OneStatement}, false, 2, false},
		{"SeveralStatements", []entstore.WriteKind{entstore.Statements}, false, 1, false},
		{"PurgeWhateverElseRuns", []entstore.WriteKind{entstore.Cleanup, entstore.OneStatement}, true, 7, true},
		{"Nothing", nil, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &committer{busy: tc.busy}
			for _, k := range tc.kinds {
				c.queue = append(c.queue, &txCall{kind: k})
			}
			c.calls.Store(tc.calls)
			if got := c.aloneWithOneStatement(); got != tc.want {
				t.Fatalf("aloneWithOneStatement() = %v, want %v", got, tc.want)
			}
		})
	}
}
