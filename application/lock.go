package application

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cleveragents/locks/domain"
)

// Precision is the resolution of every instant the service records. Times
// are truncated to it once per operation so that every adapter stores and
// compares exactly the same values.
const Precision = time.Microsecond

// CleanupExpired sizes its batches by time, not by count: how long a
// delete of n rows takes depends on the store, the disk and the load, and
// on SQLite every other writer of the process waits for the whole of it.
// Each batch aims at cleanupTarget of writing; its size follows from how
// long the last one took, within [cleanupMinBatch, cleanupMaxBatch],
// starting from cleanupFirstBatch. A millisecond is where a shorter target
// stopped helping a concurrent acquirer on a SQLite file while the purge
// kept getting slower (docs/performance.md); the floor keeps a purge
// moving on a store whose every write costs more than the target.
const (
	cleanupTarget     = time.Millisecond
	cleanupFirstBatch = 100
	cleanupMinBatch   = 20
	cleanupMaxBatch   = 20_000
)

// LockService applies the lock rules on top of a LockRepository.
//
// The rules, whose functions are in decide.go:
//   - A lock is active while now < ExpiresAt; at now == ExpiresAt it has
//     expired (domain.Lock.ExpiredAt).
//   - Acquire by the holder of an active lock is re-entrant: the expiry
//     becomes now+ttl if that is later (a re-entry extends, never
//     shortens), the acquisition time and the token stay.
//   - Acquire by another owner of an active lock fails with a
//     *domain.LockConflictError naming the holder.
//   - Acquire of a free resource, or of one whose lock has expired (whoever
//     held it), stores a new lock with a new, larger token.
//   - Renew by the holder of an active lock sets its expiry to now+ttl.
//     Renew of an expired or missing lock fails with *domain.LockExpiredError;
//     renew of another owner's active lock fails with a conflict.
//   - Release removes a lock only if the caller owns it.
//   - Take (a Handle) is never re-entrant: an active lock of any owner,
//     the caller's own included, refuses it (DecideTake); only a re-entry
//     inside the holder's work (AcquireOptions.Reentrant) shares a token.
//   - Invalid input fails with *domain.ValidationError before anything is
//     read or written.
//   - Every decision reads the clock when the store has the resource's
//     current row in hand, inside the write that applies it: never before
//     a wait for the store, which would date the lock in the past. The
//     one exception is a store that decides in one statement
//     (OneStatement), whose decisions at an earlier now are never less
//     safe (see there).
//   - After Close, every call fails with domain.ErrClosed.
type LockService struct {
	repo       LockRepository
	one        OneStatement // repo, when it can decide in one statement
	clock      Clock
	timers     Timers
	defaultTTL time.Duration
	gate       gate
	waiters    *waitQueues
	jumps      bool // the clock is one that tests move: see NewLockService
	observer   Observer
	processes  Processes
	wakeups    Wakeups
	holders    *holders // the handles holding each resource
}

// Option gives a LockService, when it is made, one of the ports it may
// do without: WithObserver, WithWakeups, WithProcesses.
type Option func(*LockService)

// NewLockService returns a service storing locks in repo and reading time
// from clock. defaultTTL replaces a zero TTL in Acquire and Renew; zero
// means domain.DefaultLockTTL, and any other value must lie within the TTL
// bounds.
func NewLockService(repo LockRepository, clock Clock, defaultTTL time.Duration, opts ...Option) (*LockService, error) {
	ttl, err := domain.ResolveTTL(defaultTTL)
	if err != nil {
		return nil, err
	}
	s := &LockService{repo: repo, clock: clock, timers: timersOf(clock), defaultTTL: ttl,
		gate: newGate(), waiters: newWaitQueues(), holders: newHolders()}
	if _, ok := clock.(Timers); ok {
		// The waiters' timers run on this clock: Waiting reads it to know
		// which timers are due (see waitQueues.now).
		s.waiters.now = clock.Now
		// A clock that a test moves (clock.Mock, testclock) jumps: a
		// move may land while a waiter looks at the store (waitTurn).
		_, s.jumps = clock.(interface{ Add(time.Duration) })
	}
	s.one, _ = repo.(OneStatement)
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// DefaultTTL returns the TTL used when a caller passes zero.
func (s *LockService) DefaultTTL() time.Duration { return s.defaultTTL }

// Now returns the service's current instant, at the precision it records.
func (s *LockService) Now() time.Time { return s.clock.Now().UTC().Truncate(Precision) }

// Close makes every later call fail with domain.ErrClosed and waits until
// the calls already in progress have returned and every keep-alive has
// ended (its context ended, with the loss LostClosed), or ctx ends (then
// it says how many were left). Once it returns nil, no call of this
// service can still change the store: the container relies on that to
// release the owner's locks last.
func (s *LockService) Close(ctx context.Context) error { return s.gate.close(ctx) }

// Acquire takes the lock on ref for owner for ttl (zero: the default TTL),
// or re-enters it if owner already holds it. It returns the lock as held.
//
// Re-entry goes by owner alone, as the spec has it: an active lock that a
// Handle of owner holds is re-entered too, and the owner-scoped Release
// then removes it under the handle (which learns of it as a loss). Give
// the handles of a process and its owner-scoped calls different owner
// ids, or use handles only.
//
// Errors: *domain.ValidationError for bad input; *domain.LockConflictError
// when another owner holds an active lock; *domain.LockExpiredError with
// WrittenAt set when the store took longer than ttl to write the lock;
// *domain.StoreError when the store fails; domain.ErrClosed after Close.
func (s *LockService) Acquire(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration) (domain.Lock, error) {
	r, err := s.acquire(ctx, owner, ref, ttl, DecideAcquire, &Op{Kind: OpAcquire})
	return r.Lock, err
}

// AcquireResult is what an owner-scoped acquisition did, for a caller that
// must say so, as `agents locks acquire` does.
type AcquireResult struct {
	// Lock is the lock as held.
	Lock domain.Lock
	// Reentered says that owner held the lock already: the token and the
	// acquisition time stay, the expiry is extended.
	Reentered bool
	// TookOverFrom is the active lock taken over because its holder, a
	// process of this machine, was gone; nil otherwise.
	TookOverFrom *domain.Lock
}

// acquire is Acquire, or Take, by decide, the rule in Go (DecideAcquire,
// DecideTake, or one of them with a deadline), and one, the Op of that
// rule that a OneStatement store may carry out instead (nil: Update
// decides, by decide).
func (s *LockService) acquire(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration,
	decide func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error),
	one *Op) (AcquireResult, error) {
	var start time.Time
	if s.observer != nil {
		start = s.clock.Now()
	}
	out, err := s.apply(ctx, owner, ref, ttl, func(cur *domain.Lock, now, expires time.Time) (Change, error) {
		return decide(cur, owner, ref, now, expires)
	}, one)
	l, kind, previous := out.Lock, EventReentered, out.Previous
	if out.Kind == ChangeInsert {
		kind = EventAcquired
		if previous != nil {
			kind = EventTakenOver
		}
	}
	var conflict *domain.LockConflictError
	if errors.As(err, &conflict) && s.processes != nil {
		dl, tookOver, derr := s.takeOverDead(ctx, owner, ref, ttl, conflict.Holder, decide)
		if tookOver {
			// The holder's process is gone: the lock changed hands before
			// its expiry, and says so through the observer.
			s.observe(ctx, Event{Kind: EventTakenOver, Owner: owner, Resource: ref, Lock: dl,
				Previous: &conflict.Holder, DeadHolder: true})
			return AcquireResult{Lock: dl, TookOverFrom: &conflict.Holder}, derr
		}
		if derr != nil || dl.Token != 0 {
			// The row changed since the probe and was decided afresh.
			l, err, kind, previous = dl, derr, EventAcquired, nil
		}
	}
	if s.observer != nil && (err == nil || errors.As(err, &conflict)) {
		e := Event{Kind: kind, Owner: owner, Resource: ref, Lock: l, Previous: previous, Took: s.clock.Now().Sub(start)}
		if err != nil {
			e.Kind, e.Previous = EventRefused, &conflict.Holder
		}
		s.observer.Observe(ctx, e)
	}
	return AcquireResult{Lock: l, Reentered: err == nil && kind == EventReentered}, err
}

// Renew sets the expiry of owner's active lock on ref to now+ttl (zero: the
// default TTL) and returns the lock. Call it every RenewInterval(ttl) during
// long work.
//
// Errors: *domain.ValidationError for bad input; *domain.LockExpiredError
// when owner's lock has expired or is gone (owner must acquire again), or
// (with WrittenAt set) when the store took longer than ttl to write the
// renewal; *domain.LockConflictError when another owner holds an active
// lock; *domain.StoreError when the store fails; domain.ErrClosed after
// Close.
func (s *LockService) Renew(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration) (domain.Lock, error) {
	l, err := s.renew(ctx, owner, ref, ttl)
	if s.observer != nil && !errors.Is(err, domain.ErrValidation) && !errors.Is(err, domain.ErrClosed) {
		e := Event{Kind: EventRenewed, Owner: owner, Resource: ref, Lock: l}
		if err != nil {
			e.Kind, e.Err = EventRenewFailed, err
		}
		s.observer.Observe(ctx, e)
	}
	return l, err
}

// renew is Renew without its event.
func (s *LockService) renew(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration) (domain.Lock, error) {
	op := Op{Kind: OpRenew, Owner: owner, Ref: ref}
	out, err := s.apply(ctx, owner, ref, ttl, op.Decide, &op)
	return out.Lock, err
}

// Release removes owner's lock on ref and reports whether there was one. A
// lock held by another owner is never touched; releasing a lock that is not
// held is not an error, so Release is safe to call on every exit path.
//
// Errors: *domain.ValidationError for bad input; *domain.StoreError;
// domain.ErrClosed after Close.
func (s *LockService) Release(ctx context.Context, owner string, ref domain.ResourceRef) (bool, error) {
	return s.release(ctx, owner, ref, time.Time{})
}

// release is Release, with when the lock was acquired if the caller knows
// (a Handle), for the hold time of the event.
func (s *LockService) release(ctx context.Context, owner string, ref domain.ResourceRef, acquired time.Time) (bool, error) {
	if err := s.gate.enter(); err != nil {
		return false, err
	}
	defer s.gate.leave()
	if err := domain.ValidateOwner(owner); err != nil {
		return false, err
	}
	if err := ref.Validate(); err != nil {
		return false, err
	}
	ok, err := s.repo.DeleteOwned(ctx, ref, owner)
	if ok {
		s.freed(ref)
		e := Event{Kind: EventReleased, Owner: owner, Resource: ref}
		if !acquired.IsZero() && s.observer != nil {
			e.HeldFor = s.Now().Sub(acquired)
		}
		s.observe(ctx, e)
	}
	return ok, err
}

// ReleaseAllForOwner removes every lock of owner, active or expired, and
// returns how many. The container calls it on shutdown so that the
// resources become available to other processes at once.
//
// Errors: *domain.ValidationError for a bad owner; *domain.StoreError;
// domain.ErrClosed after Close.
func (s *LockService) ReleaseAllForOwner(ctx context.Context, owner string) (int, error) {
	if err := s.gate.enter(); err != nil {
		return 0, err
	}
	defer s.gate.leave()
	if err := domain.ValidateOwner(owner); err != nil {
		return 0, err
	}
	n, err := s.repo.DeleteAllOwned(ctx, owner)
	if n > 0 {
		s.waiters.wakeAll()
		s.observe(ctx, Event{Kind: EventReleasedAll, Owner: owner, Count: n})
	}
	return n, err
}

// CleanupExpired purges every lock that has expired now and returns how
// many. It deletes in batches, each its own short write, sized from the
// time the previous one took (on the service's clock) so that each write
// lasts about a millisecond however fast the store and the disk are: a
// writer queued behind a batch waits about that long, not for the whole
// backlog. It stops early, with the count so far, if ctx is cancelled.
//
// It stops at a batch that comes back short of its limit, as
// LockRepository.DeleteExpired promises once no more have expired. A
// purge long enough to need cleanupCountAfter full batches asks the store
// once how many expired locks are left (CountExpired): the purge then
// never reports removing more than the store held, and one on a store
// whose DeleteExpired keeps reporting full batches ends with an error
// that says so, instead of looping for ever.
//
// Errors: *domain.StoreError, also for a store that reports removing more
// expired locks than it held; ctx.Err() when cancelled between batches;
// domain.ErrClosed after Close.
func (s *LockService) CleanupExpired(ctx context.Context) (int, error) {
	if err := s.gate.enter(); err != nil {
		return 0, err
	}
	defer s.gate.leave()
	n, err := s.cleanupExpired(ctx)
	if n > 0 {
		s.observe(ctx, Event{Kind: EventCleanedUp, Count: n})
	}
	return n, err
}

// cleanupCountAfter is how many full batches a purge runs before it asks
// the store how many expired locks are left: the count costs a read, which
// a purge of a few batches (most of them) does without.
const cleanupCountAfter = 4

func (s *LockService) cleanupExpired(ctx context.Context) (int, error) {
	now := s.Now()
	total, limit := 0, cleanupFirstBatch
	// held is how many expired locks the store held when the purge
	// began, once counted: removed so far, and left (CountExpired).
	held, left := -1, 0
	for batch := 1; ; batch++ {
		start := s.clock.Now()
		n, err := s.repo.DeleteExpired(ctx, now, limit)
		total += n
		if err != nil || n < limit {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
		if held >= 0 && total > held {
			// A lock written after the purge began expires after the
			// instant of its write (clocks agreeing), so none joins the
			// locks expired at the purge's now: the store has reported
			// removing locks it never held, and will go on reporting full
			// batches.
			return total, &domain.StoreError{Op: "clean up expired locks", Advice: "the store breaks a promise of " +
				"application.LockRepository (check it with package locktest)", Err: fmt.Errorf(
				"DeleteExpired reported removing %d expired locks in this purge, more than the %d the store held "+
					"(%d reported removed by batch %d, and %d left then by CountExpired); it must return fewer than its limit "+
					"once no more have expired, so the purge stopped rather than loop for ever",
				total, held, held-left, cleanupCountAfter, left)}
		}
		if batch == cleanupCountAfter {
			if left, err = s.repo.CountExpired(ctx, now); err != nil {
				return total, err
			}
			held = total + left
		}
		// Between two batches, the writers that queued behind the last
		// one go first: the next batch queues behind them (SQLite's
		// writer queue is first come, first served), so none of them
		// waits for more than about one batch.
		limit = nextCleanupBatch(limit, s.clock.Now().Sub(start))
	}
}

// nextCleanupBatch sizes the batch after one of limit rows that took took:
// the rows that fit in cleanupTarget at the rate just seen, growing at most
// twofold at a time (a batch that was fast by luck must not make the next
// one long), shrinking at once, and within [cleanupMinBatch,
// cleanupMaxBatch].
func nextCleanupBatch(limit int, took time.Duration) int {
	next := 2 * limit
	if took > 0 {
		next = min(next, int(int64(limit)*int64(cleanupTarget)/int64(took)))
	}
	return max(cleanupMinBatch, min(cleanupMaxBatch, next))
}

// StaleCount returns how many locks have expired but are still stored: a
// non-zero count means cleanup has not run since they expired.
//
// Errors: *domain.StoreError; domain.ErrClosed after Close.
func (s *LockService) StaleCount(ctx context.Context) (int, error) {
	if err := s.gate.enter(); err != nil {
		return 0, err
	}
	defer s.gate.leave()
	return s.repo.CountExpired(ctx, s.Now())
}

// Get returns the stored lock on ref, which may have expired (check
// Lock.ExpiredAt against Now), or domain.ErrNotFound.
//
// Errors: *domain.ValidationError; domain.ErrNotFound; *domain.StoreError;
// domain.ErrClosed after Close.
func (s *LockService) Get(ctx context.Context, ref domain.ResourceRef) (domain.Lock, error) {
	if err := s.gate.enter(); err != nil {
		return domain.Lock{}, err
	}
	defer s.gate.leave()
	if err := ref.Validate(); err != nil {
		return domain.Lock{}, err
	}
	return s.repo.Get(ctx, ref)
}

// ListOptions selects locks for List. Zero fields do not filter.
type ListOptions struct {
	// Type, when set, keeps only the locks of that resource type.
	Type domain.ResourceType
	// Owner, when set, keeps only that owner's locks.
	Owner string
	// IncludeExpired also returns locks that have expired but are not yet
	// purged.
	IncludeExpired bool
}

// List returns the locks matching opts, ordered by resource type and id.
//
// Errors: *domain.ValidationError for a bad filter; *domain.StoreError;
// domain.ErrClosed after Close.
func (s *LockService) List(ctx context.Context, opts ListOptions) ([]domain.Lock, error) {
	if err := s.gate.enter(); err != nil {
		return nil, err
	}
	defer s.gate.leave()
	if opts.Type != "" && !opts.Type.Valid() {
		return nil, (domain.ResourceRef{Type: opts.Type, ID: "-"}).Validate()
	}
	if opts.Owner != "" {
		if err := domain.ValidateOwner(opts.Owner); err != nil {
			return nil, err
		}
	}
	f := ListFilter{Type: opts.Type, Owner: opts.Owner}
	if !opts.IncludeExpired {
		f.ActiveAt = s.Now()
	}
	return s.repo.List(ctx, f)
}

// apply carries out a decision for owner on ref with ttl: by one, in one
// statement, when one is set and the store can (OneStatement) and
// decides; otherwise, or when it left the decision, through Update by
// rule, which is one's rule in Go (Op.Decide) or one that the store
// cannot carry out. It returns what was done, with the lock as write
// returns it.
func (s *LockService) apply(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration,
	rule func(cur *domain.Lock, now, expires time.Time) (Change, error), one *Op) (Outcome, error) {
	var out Outcome
	l, err := s.write(ctx, owner, ref, ttl, func(ttl time.Duration) (domain.Lock, error) {
		if s.one != nil && one != nil {
			op := *one
			op.Owner, op.Ref, op.At = owner, ref, s.times(ttl)
			o, err := s.one.Apply(ctx, op)
			if err != nil || o.Kind != ChangeNone {
				out = o
				return o.Lock, err
			}
		}
		return s.repo.Update(ctx, ref, s.decideNow(ttl, func(cur *domain.Lock, now, expires time.Time) (Change, error) {
			c, err := rule(cur, now, expires)
			out = Outcome{Kind: c.Kind}
			if c.Kind == ChangeInsert {
				out.Previous = cur
			}
			return c, err
		}))
	})
	out.Lock = l
	return out, err
}

// times reads now on the service's clock, and the expiry now+ttl.
func (s *LockService) times(ttl time.Duration) func() (time.Time, time.Time) {
	return func() (time.Time, time.Time) {
		now := s.Now()
		return now, now.Add(ttl).Truncate(Precision)
	}
}

// decideNow is rule as a Decide function, which reads now when the store
// calls it, once the current row is in hand, and not before: the store may
// first wait for other writers (a busy database, a queue of writes) for
// longer than the TTL, and a lock dated before that wait could be returned
// already expired. The write itself can still be slow (a commit waiting
// for the disk): write refuses a lock that has expired by the time the
// store returns (lateWrite).
func (s *LockService) decideNow(ttl time.Duration, rule func(cur *domain.Lock, now, expires time.Time) (Change, error)) Decide {
	return func(cur *domain.Lock) (Change, error) {
		now, expires := s.times(ttl)()
		return rule(cur, now, expires)
	}
}

// write validates the input, runs do with the TTL to use, inside the gate,
// and refuses a lock that do returns already expired (lateWrite).
func (s *LockService) write(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration,
	do func(ttl time.Duration) (domain.Lock, error)) (domain.Lock, error) {
	ttl, err := s.checkInput(owner, ref, ttl)
	if err != nil {
		return domain.Lock{}, err
	}
	if err := s.gate.enter(); err != nil {
		return domain.Lock{}, err
	}
	defer s.gate.leave()
	l, err := do(ttl)
	if err == nil {
		err = lateWrite(l, owner, ref, s.Now())
	}
	if err != nil {
		return domain.Lock{}, err
	}
	return l, nil
}

func (s *LockService) checkInput(owner string, ref domain.ResourceRef, ttl time.Duration) (time.Duration, error) {
	if err := domain.ValidateOwner(owner); err != nil {
		return 0, err
	}
	if err := ref.Validate(); err != nil {
		return 0, err
	}
	if ttl == 0 {
		return s.defaultTTL, nil
	}
	if err := domain.ValidateTTL(ttl); err != nil {
		return 0, err
	}
	return ttl, nil
}
