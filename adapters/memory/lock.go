// Package memory stores locks in the memory of one process. It passes the
// same contract suite as the SQL stores, and is the test double of choice:
// fast, and with no files to clean up.
package memory

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

var _ application.LockRepository = (*LockRepository)(nil)

// LockRepository implements application.LockRepository in memory, safe for
// concurrent use. Make it with NewLockRepository.
type LockRepository struct {
	mu    sync.Mutex
	locks map[domain.ResourceRef]domain.Lock
	// lastToken only grows, also when the map empties, as SQLite's AUTOINCREMENT does.
	lastToken int64
}

// NewLockRepository returns an empty repository.
func NewLockRepository() *LockRepository {
	return &LockRepository{locks: make(map[domain.ResourceRef]domain.Lock)}
}

// lock takes the mutex, unless ctx has ended.
func (r *LockRepository) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	return nil
}

// Update implements application.LockRepository; decide runs under the repository's mutex.
func (r *LockRepository) Update(ctx context.Context, ref domain.ResourceRef, decide application.Decide) (domain.Lock, error) {
	if err := r.lock(ctx); err != nil {
		return domain.Lock{}, err
	}
	defer r.mu.Unlock()
	var cur *domain.Lock
	if l, ok := r.locks[ref]; ok {
		cur = &l
	}
	change, err := decide(cur)
	if err != nil {
		return domain.Lock{}, err
	}
	var l domain.Lock
	switch change.Kind {
	case application.ChangeExtend:
		if cur == nil {
			return domain.Lock{}, &domain.StoreError{Op: "extend lock", Err: domain.ErrNotFound}
		}
		l = *cur
		l.ExpiresAt = stored(change.Lock.ExpiresAt)
	case application.ChangeInsert:
		r.lastToken++
		l = change.Lock
		l.Token, l.Resource = r.lastToken, ref
		l.AcquiredAt, l.ExpiresAt = stored(l.AcquiredAt), stored(l.ExpiresAt)
	default:
		if cur == nil {
			return domain.Lock{}, nil
		}
		return *cur, nil
	}
	r.locks[ref] = l
	return l, nil
}

// stored is an instant as the SQL stores keep it (UTC, truncated to
// application.Precision), so that expiry falls at the same instants.
func stored(t time.Time) time.Time { return t.UTC().Truncate(application.Precision) }

// Get implements application.LockRepository.
func (r *LockRepository) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	if err := r.lock(ctx); err != nil {
		return domain.Lock{}, err
	}
	defer r.mu.Unlock()
	if l, ok := r.locks[ref]; ok {
		return l, nil
	}
	return domain.Lock{}, domain.ErrNotFound
}

// List implements application.LockRepository.
func (r *LockRepository) List(ctx context.Context, f application.ListFilter) ([]domain.Lock, error) {
	if err := r.lock(ctx); err != nil {
		return nil, err
	}
	out := make([]domain.Lock, 0, len(r.locks))
	for _, l := range r.locks {
		if (f.Type == "" || l.Resource.Type == f.Type) && (f.Owner == "" || l.Owner == f.Owner) &&
			(f.ActiveAt.IsZero() || !l.ExpiredAt(f.ActiveAt)) {
			out = append(out, l)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b domain.Lock) int {
		return cmp.Or(cmp.Compare(a.Resource.Type, b.Resource.Type), cmp.Compare(a.Resource.ID, b.Resource.ID))
	})
	return out, nil
}

// DeleteOwned implements application.LockRepository.
func (r *LockRepository) DeleteOwned(ctx context.Context, ref domain.ResourceRef, owner string) (bool, error) {
	return r.deleteIf(ctx, ref, func(l domain.Lock) bool { return l.Owner == owner })
}

// DeleteToken implements application.LockRepository.
func (r *LockRepository) DeleteToken(ctx context.Context, ref domain.ResourceRef, token int64, now time.Time) (bool, error) {
	return r.deleteIf(ctx, ref, func(l domain.Lock) bool { return l.Token == token && !l.ExpiredAt(now) })
}

func (r *LockRepository) deleteIf(ctx context.Context, ref domain.ResourceRef, match func(domain.Lock) bool) (bool, error) {
	if err := r.lock(ctx); err != nil {
		return false, err
	}
	defer r.mu.Unlock()
	if l, ok := r.locks[ref]; ok && match(l) {
		delete(r.locks, ref)
		return true, nil
	}
	return false, nil
}

// DeleteAllOwned implements application.LockRepository.
func (r *LockRepository) DeleteAllOwned(ctx context.Context, owner string) (int, error) {
	return r.count(ctx, -1, true, func(l domain.Lock) bool { return l.Owner == owner })
}

// DeleteExpired implements application.LockRepository.
func (r *LockRepository) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	return r.count(ctx, limit, true, func(l domain.Lock) bool { return l.ExpiredAt(now) })
}

// CountExpired implements application.LockRepository.
func (r *LockRepository) CountExpired(ctx context.Context, now time.Time) (int, error) {
	return r.count(ctx, -1, false, func(l domain.Lock) bool { return l.ExpiredAt(now) })
}

// count counts up to limit locks that match (all when negative), deleting them if del.
func (r *LockRepository) count(ctx context.Context, limit int, del bool, match func(domain.Lock) bool) (int, error) {
	if err := r.lock(ctx); err != nil {
		return 0, err
	}
	defer r.mu.Unlock()
	n := 0
	for ref, l := range r.locks {
		if n == limit {
			break
		}
		if match(l) {
			if del {
				delete(r.locks, ref)
			}
			n++
		}
	}
	return n, nil
}
