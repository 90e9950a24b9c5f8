package tests

import (
	"errors"
	"maps"
	"sync"
	"time"

	"pgregory.net/rapid"

	"github.com/cleveragents/locks/domain"
)

// Concurrently runs two to four operations at once, so that stores with
// group commit decide them in one shared transaction; the outcome must be
// that of the model applying them one after the other, in some order.

type concurrentOp struct {
	name  string
	owner string
	ref   domain.ResourceRef
	ttl   time.Duration
}

type concurrentResult struct {
	lock     domain.Lock
	released bool
	err      error
}

func (s *machine) Concurrently(t *rapid.T) {
	// Up to four at once, often of one kind: PostgreSQL batches the writes
	// of one kind that wait while another of that kind is in flight, so
	// that a batch of two needs three of a kind.
	ops := make([]concurrentOp, rapid.IntRange(2, 4).Draw(t, "concurrent"))
	kinds := []string{"acquire", "renew", "release"}
	oneKind := rapid.Bool().Draw(t, "oneKind")
	kind := rapid.SampledFrom(kinds).Draw(t, "kind")
	for i := range ops {
		owner, ref, ttl := s.pick(t)
		name := kind
		if !oneKind {
			name = rapid.SampledFrom(kinds).Draw(t, "op")
		}
		ops[i] = concurrentOp{name, owner, ref, ttl}
	}
	results := make([]concurrentResult, len(ops))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Go(func() {
			<-start
			r := &results[i]
			switch op.name {
			case "acquire":
				r.lock, r.err = s.svc.Acquire(s.ctx, op.owner, op.ref, op.ttl)
			case "renew":
				r.lock, r.err = s.svc.Renew(s.ctx, op.owner, op.ref, op.ttl)
			default:
				r.released, r.err = s.svc.Release(s.ctx, op.owner, op.ref)
			}
		})
	}
	close(start)
	wg.Wait()
	// Orders can agree on every result and still leave different states
	// (two re-entries with different TTLs), so the stored state decides
	// between them.
	stored := s.stored(t)
	for _, order := range orders(len(ops)) {
		m := &model{now: s.model.now, locks: maps.Clone(s.model.locks), last: s.model.last, postgres: s.model.postgres}
		explained := true
		for _, i := range order {
			if !m.explains(ops[i], results[i]) {
				explained = false
				break
			}
		}
		if explained && m.state() == stored {
			s.model = m
			return
		}
	}
	t.Fatalf("no order of %+v explains the results %+v and the stored state %v (the model, before: %v at %v, last token %d)", ops, results, stored, s.model.state(), s.model.now, s.model.last)
}

// explains applies op to m and reports whether the result is what m says.
func (m *model) explains(op concurrentOp, r concurrentResult) bool {
	var (
		want modelLock
		kind string
	)
	last := m.last
	switch op.name {
	case "acquire":
		want, kind = m.acquire(op.owner, op.ref, op.ttl)
	case "renew":
		want, kind = m.renew(op.owner, op.ref, op.ttl)
	default:
		before, had := m.locks[op.ref]
		released, kind := m.release(op.owner, op.ref)
		if m.postgres && released && !r.released && !m.now.Before(before.expires) {
			// On PostgreSQL a release of the owner's expired lock that
			// meets the owner's own acquire taking that lock over finds
			// the old row deleted and the new one not yet visible to it:
			// it removes nothing, and says so. Taken as a release that
			// ran first and found nothing, the takeover then follows.
			m.locks[op.ref] = before
			return had && kindOf(r.err) == kind
		}
		return kindOf(r.err) == kind && r.released == released
	}
	if kindOf(r.err) != kind {
		return false
	}
	got := r.lock
	switch kind {
	case "ok":
		if m.postgres && m.last > last && got.Token > want.token {
			want = m.adopt(op.ref, got.Token)
		}
	case "conflict":
		var ce *domain.LockConflictError
		if !errors.As(r.err, &ce) {
			return false
		}
		got = ce.Holder
	default:
		return true
	}
	return got.Owner == want.owner && got.Token == want.token && got.Resource == op.ref &&
		got.AcquiredAt.Equal(want.acquired) && got.ExpiresAt.Equal(want.expires)
}

// orders returns every order of n items.
func orders(n int) [][]int {
	if n == 1 {
		return [][]int{{0}}
	}
	var out [][]int
	for _, rest := range orders(n - 1) {
		for at := 0; at <= len(rest); at++ {
			o := append(append(append([]int{}, rest[:at]...), n-1), rest[at:]...)
			out = append(out, o)
		}
	}
	return out
}
