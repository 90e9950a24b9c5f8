// Package mapstore is a lock store of another module than the lock
// module's: a map guarded by a mutex, which keeps the locks of one
// process. It shows what a store must do to pass package locktest, and,
// with a planted bug switched on (Bug), what the suite prints when a store
// breaks a promise. docs/adapters.md of the lock module walks through it.
package mapstore

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

var _ application.LockRepository = (*Store)(nil)

// Bug names a planted bug, for the test that shows locktest catching it;
// the zero value plants none.
type Bug string

// The planted bugs. Each is a mistake a store's author could make.
const (
	// BugExpiryBoundary treats a lock as expired only after ExpiresAt,
	// not at it, when purging and counting: the rule is that a lock is
	// active strictly before ExpiresAt.
	BugExpiryBoundary Bug = "expiry-boundary"
	// BugTokenReuse numbers a new lock from the largest token stored, so
	// that a token is handed out again once the store empties, and a
	// fenced write of a former holder passes.
	BugTokenReuse Bug = "token-reuse"
	// BugOwnerFold matches owners case-insensitively when releasing, as
	// a SQL store on a case-insensitive collation would: "Alice" then
	// releases the lock of "alice", another owner.
	BugOwnerFold Bug = "owner-fold"
	// BugNoLimit ignores DeleteExpired's limit and purges every expired
	// lock in one write, which holds the store for as long as the backlog
	// takes.
	BugNoLimit Bug = "no-limit"
	// BugFullBatches reports DeleteExpired's limit as the count removed,
	// whatever it removed, as a SQL store that returns the limit it bound
	// rather than the rows the statement affected would: a caller that
	// purges in batches until one comes back short never stops.
	BugFullBatches Bug = "full-batches"
	// BugNoneZero returns the zero Lock from an Update whose Decide
	// changed nothing, where the port promises the current lock, as a SQL
	// store that returns the row of its write would when it wrote none.
	BugNoneZero Bug = "none-zero"
	// BugTokenEarly draws a new lock's token before it takes the mutex
	// that orders the writes, as a SQL store that draws from a sequence
	// before the statement that waits for the row would: the tokens never
	// repeat and grow on each goroutine, but a writer that drew first and
	// wrote last hands out a smaller token after a larger one, and a
	// fenced write of the newer holder's predecessor passes.
	BugTokenEarly Bug = "token-early"
	// BugMutexLeak returns from Update on Decide's error (a conflict, the
	// commonest answer) without unlocking the store's mutex, as a store
	// that unlocks by hand at the end of the function rather than with
	// defer would: every later call of the store waits for ever.
	BugMutexLeak Bug = "mutex-leak"
)

// Store implements application.LockRepository in a map. It is safe for
// concurrent use. Create one with New.
type Store struct {
	bug       Bug
	mu        sync.Mutex
	locks     map[domain.ResourceRef]domain.Lock
	lastToken int64        // only grows, also when the map empties
	early     atomic.Int64 // the token counter of BugTokenEarly
}

// New returns an empty store with the bug planted (none for "").
func New(bug Bug) *Store {
	return &Store{bug: bug, locks: map[domain.ResourceRef]domain.Lock{}}
}

// Update reads the lock on ref and applies decide's change, under the
// mutex, so that no other writer comes between the read and the write.
func (s *Store) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	if err := ctx.Err(); err != nil {
		return domain.Lock{}, err
	}
	var early int64
	if s.bug == BugTokenEarly {
		early = s.early.Add(1)
		// A round trip to the database between the draw and the write,
		// of varying length as on a network: a fixed one would keep the
		// writers in the order they drew.
		time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
	}
	s.mu.Lock()
	unlock := true
	defer func() {
		if unlock {
			s.mu.Unlock() // also when decide panics
		}
	}()
	var cur *domain.Lock
	if l, ok := s.locks[ref]; ok {
		cur = &l
	}
	change, err := decide(cur)
	if err != nil {
		unlock = s.bug != BugMutexLeak
		return domain.Lock{}, err // unchanged: the service matches it
	}
	switch change.Kind {
	case application.ChangeInsert:
		l := change.Lock
		l.Resource, l.Token = ref, s.nextToken()
		if s.bug == BugTokenEarly {
			l.Token = early
		}
		l.AcquiredAt, l.ExpiresAt = l.AcquiredAt.UTC(), l.ExpiresAt.UTC()
		s.locks[ref] = l
		return l, nil
	case application.ChangeExtend:
		if cur == nil {
			return domain.Lock{}, &domain.StoreError{Op: "extend lock", Err: domain.ErrNotFound}
		}
		l := *cur
		l.ExpiresAt = change.Lock.ExpiresAt.UTC()
		s.locks[ref] = l
		return l, nil
	}
	if cur == nil || s.bug == BugNoneZero {
		return domain.Lock{}, nil
	}
	return *cur, nil
}

func (s *Store) nextToken() int64 {
	if s.bug == BugTokenReuse {
		var top int64
		for _, l := range s.locks {
			top = max(top, l.Token)
		}
		return top + 1
	}
	s.lastToken++
	return s.lastToken
}

// Get returns the lock on ref, active or expired, or domain.ErrNotFound.
func (s *Store) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	if err := ctx.Err(); err != nil {
		return domain.Lock{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.locks[ref]
	if !ok {
		return domain.Lock{}, domain.ErrNotFound
	}
	return l, nil
}

// List returns the locks that filter selects, by resource type, then id.
func (s *Store) List(ctx context.Context, filter application.ListFilter) ([]domain.Lock, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	var out []domain.Lock
	for _, l := range s.locks {
		if (filter.Type == "" || l.Resource.Type == filter.Type) && (filter.Owner == "" || l.Owner == filter.Owner) &&
			(filter.ActiveAt.IsZero() || !l.ExpiredAt(filter.ActiveAt)) {
			out = append(out, l)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b domain.Lock) int {
		return cmp.Or(cmp.Compare(a.Resource.Type, b.Resource.Type), cmp.Compare(a.Resource.ID, b.Resource.ID))
	})
	return out, nil
}

// DeleteOwned removes owner's lock on ref, active or expired.
func (s *Store) DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error) {
	return s.deleteOne(ctx, ref, func(l domain.Lock) bool { return s.sameOwner(l.Owner, owner) })
}

// DeleteToken removes the lock on ref whose token is token, if it is
// active at now.
func (s *Store) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	return s.deleteOne(ctx, ref, func(l domain.Lock) bool { return l.Token == token && !l.ExpiredAt(now) })
}

// DeleteAllOwned removes every lock of owner.
func (s *Store) DeleteAllOwned(ctx context.Context, owner string) (int, error) {
	return s.deleteAll(ctx, -1, func(l domain.Lock) bool { return s.sameOwner(l.Owner, owner) })
}

// sameOwner compares owners byte for byte, unless the fold bug is planted.
func (s *Store) sameOwner(stored, owner string) bool {
	if s.bug == BugOwnerFold {
		return strings.EqualFold(stored, owner)
	}
	return stored == owner
}

// DeleteExpired removes at most limit locks expired at now.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if s.bug == BugNoLimit {
		limit = -1
	}
	n, err := s.deleteAll(ctx, limit, func(l domain.Lock) bool { return s.expired(l, now) })
	if s.bug == BugFullBatches && err == nil {
		n = limit
	}
	return n, err
}

// CountExpired counts the locks expired at now.
func (s *Store) CountExpired(ctx context.Context, now time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.locks {
		if s.expired(l, now) {
			n++
		}
	}
	return n, nil
}

// expired is domain.Lock.ExpiredAt, unless the boundary bug is planted.
func (s *Store) expired(l domain.Lock, now time.Time) bool {
	if s.bug == BugExpiryBoundary {
		return now.After(l.ExpiresAt)
	}
	return l.ExpiredAt(now)
}

func (s *Store) deleteOne(ctx context.Context, ref domain.ResourceRef, match func(domain.Lock) bool) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.locks[ref]; ok && match(l) {
		delete(s.locks, ref)
		return true, nil
	}
	return false, nil
}

// deleteAll removes up to limit matching locks (all when limit < 0).
func (s *Store) deleteAll(ctx context.Context, limit int, match func(domain.Lock) bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for ref, l := range s.locks {
		if n == limit {
			break
		}
		if match(l) {
			delete(s.locks, ref)
			n++
		}
	}
	return n, nil
}
