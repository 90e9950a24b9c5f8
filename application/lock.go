package application

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cleveragents/locks/domain"
)

// Precision is the resolution of every instant, the same on every adapter.
const Precision = time.Microsecond

// LockService applies the rules of decide.go on a LockRepository, reading the
// clock with the row in hand, never before a wait that would date the lock in
// the past. Bad input fails with *domain.ValidationError before any I/O.
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
	queue      Queue    // orders waiters across processes; nil: only within this one
	holders    *holders // the handles holding each resource
}

// Option gives a LockService an optional port.
type Option func(*LockService)

// realTimers waits on real time, for a Clock that has no timers.
type realTimers struct{}

func (realTimers) After(d time.Duration) <-chan time.Time { return time.After(d) }

// NewLockService returns a service on repo and clock; defaultTTL replaces a
// zero TTL (zero: domain.DefaultLockTTL).
func NewLockService(repo LockRepository, clock Clock, defaultTTL time.Duration, opts ...Option) (*LockService, error) {
	ttl, err := domain.ResolveTTL(defaultTTL)
	if err != nil {
		return nil, err
	}
	s := &LockService{repo: repo, clock: clock, timers: realTimers{}, defaultTTL: ttl,
		gate:    gate{closing: make(chan struct{})},
		waiters: &waitQueues{queues: make(map[domain.ResourceRef][]*waiter), yields: make(map[domain.ResourceRef]time.Time)},
		holders: &holders{slots: make(map[domain.ResourceRef]*slot)}}
	if t, ok := clock.(Timers); ok {
		// A clock that a test moves jumps, maybe while a waiter looks (waitTurn).
		s.timers, s.waiters.now = t, clock.Now
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

// until is how long a timer must run to fire at t: from the clock as it
// reads, not rounded as Now is, so that it never lands after t.
func (s *LockService) until(t time.Time) time.Duration { return t.Sub(s.clock.Now()) }

// Close makes later calls fail with domain.ErrClosed and waits for the calls
// and keep-alives in progress, or ctx: the container then releases last.
func (s *LockService) Close(ctx context.Context) error { return s.gate.close(ctx) }

// gate admits calls until Close, which waits for them: a queued acquire would
// otherwise commit after the release-all and block its resource for a TTL.
type gate struct {
	mu       sync.Mutex
	inFlight int
	keepers  int // keep-alives running: Close waits for their contexts to end too
	closed   bool
	idle     chan struct{} // closed once the gate is closed and empty
	closing  chan struct{} // closed when the gate closes: waits stop at once
}

// admit counts a call or keep-alive (n), or returns domain.ErrClosed.
func (g *gate) admit(n *int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return domain.ErrClosed
	}
	*n++
	return nil
}

func (g *gate) dismiss(n *int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	*n--
	g.idleIfDone()
}

func (g *gate) enter() error { return g.admit(&g.inFlight) }
func (g *gate) leave()       { g.dismiss(&g.inFlight) }
func (g *gate) keep() error  { return g.admit(&g.keepers) }
func (g *gate) unkeep()      { g.dismiss(&g.keepers) }

func (g *gate) idleIfDone() {
	if g.closed && g.inFlight == 0 && g.keepers == 0 {
		close(g.idle)
	}
}

// close refuses later calls and waits for the admitted ones, or ctx.
func (g *gate) close(ctx context.Context) error {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.closing)
		g.idle = make(chan struct{})
		g.idleIfDone()
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		n, k := g.inFlight, g.keepers
		g.mu.Unlock()
		return fmt.Errorf("closing the lock service: %d calls were still in flight, and %d keep-alives running, when waiting for them ended (%w); "+
			"locks they take stay held until they expire", n, k, ctx.Err())
	}
}

// Acquire takes the lock on ref for owner for ttl (zero: the default), or
// re-enters owner's active lock, a Handle's too, and returns it.
// Errors: *domain.ValidationError; *domain.LockConflictError naming another
// owner's active lock; *domain.LockExpiredError with WrittenAt set when the
// write outlasted ttl; *domain.StoreError; domain.ErrClosed.
func (s *LockService) Acquire(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration, opts ...AcquireOption) (domain.Lock, error) {
	var o AcquireOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := domain.ValidateNote(o.Note); err != nil {
		return domain.Lock{}, err
	}
	r, err := s.acquire(ctx, owner, ref, ttl, o.Note, DecideAcquire, &Op{Kind: OpAcquire})
	return r.Lock, err
}

// AcquireOption tunes an Acquire; Take and Do take AcquireOptions itself.
type AcquireOption func(*AcquireOptions)

// WithNote stores note with the lock an Acquire takes (AcquireOptions.Note).
func WithNote(note string) AcquireOption { return func(o *AcquireOptions) { o.Note = note } }

// AcquireResult is what an owner-scoped acquisition did.
type AcquireResult struct {
	Lock         domain.Lock  // as stored
	Reentered    bool         // owner held the lock already (token kept, expiry extended)
	TookOverFrom *domain.Lock // the active lock of a gone process taken over, or nil
}

// rule decides owner's acquisition of ref.
type rule func(cur *domain.Lock, owner string, ref domain.ResourceRef, now, expires time.Time) (Change, error)

// acquire decides by decide, or by one in a OneStatement store (nil: Update),
// storing note with a new lock.
func (s *LockService) acquire(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration, note string,
	decide rule, one *Op) (AcquireResult, error) {
	start := s.started()
	decide = noted(decide, note)
	if one != nil {
		op := *one
		op.Note = note
		one = &op
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

// Processes tells whether a process holding a lock (domain.ProcessOwner) is gone.
type Processes interface {
	// Gone reports whether p's process (same host, boot and pid namespace) is
	// provably gone, group included; false whenever it cannot be sure.
	Gone(p domain.ProcessOwner) bool
}

// WithProcesses lets Acquire take over a gone process's active lock (nil: never).
func WithProcesses(p Processes) Option { return func(s *LockService) { s.processes = p } }

// takeOverDead takes the lock if holder is a gone process (s.processes set); the probe runs
// before the write, which decides on the row as overDead has it.
func (s *LockService) takeOverDead(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration,
	holder domain.Lock, decide rule) (domain.Lock, bool, error) {
	p, ok := domain.ParseProcessOwner(holder.Owner)
	if !ok || holder.Owner == owner || !s.processes.Gone(p) {
		return domain.Lock{}, false, nil
	}
	tookOver := false
	out, err := s.apply(ctx, owner, ref, ttl, func(cur *domain.Lock, now, expires time.Time) (Change, error) {
		cur, tookOver = overDead(holder, cur, now)
		return decide(cur, owner, ref, now, expires)
	}, nil)
	// Matching the dead holder but writing nothing takes nothing over.
	return out.Lock, tookOver && (err == nil || out.Lock.Token != 0), err
}

// Renew sets owner's active lock on ref to expire at now+ttl (zero: the
// default) and returns it.
// Errors: *domain.ValidationError; *domain.LockExpiredError when owner's
// lock expired or is gone, or (WrittenAt set) the write outlasted ttl;
// *domain.LockConflictError; *domain.StoreError; domain.ErrClosed.
func (s *LockService) Renew(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration) (domain.Lock, error) {
	op := Op{Kind: OpRenew, Owner: owner, Ref: ref}
	out, err := s.apply(ctx, owner, ref, ttl, op.Decide, &op)
	s.observeRenewal(ctx, owner, ref, out.Lock, err)
	return out.Lock, err
}

// Release removes owner's lock on ref, never another owner's, and reports
// whether there was one; releasing a lock not held is no error.
// Errors: *domain.ValidationError; *domain.StoreError; domain.ErrClosed.
func (s *LockService) Release(ctx context.Context, owner string, ref domain.ResourceRef) (bool, error) {
	if err := s.gate.enter(); err != nil {
		return false, err
	}
	defer s.gate.leave()
	if _, err := s.checkInput(owner, ref, 0); err != nil {
		return false, err
	}
	ok, err := s.repo.DeleteOwned(ctx, ref, owner)
	if ok {
		s.freed(ref)
		s.observe(ctx, Event{Kind: EventReleased, Owner: owner, Resource: ref})
	}
	return ok, err
}

// ReleaseAllForOwner removes every lock of owner and returns how many.
// Errors: *domain.ValidationError; *domain.StoreError; domain.ErrClosed.
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
		s.holders.pokeAll()
		s.observe(ctx, Event{Kind: EventReleasedAll, Owner: owner, Count: n})
	}
	return n, err
}

// Get returns the stored lock on ref, which may have expired.
// Errors: *domain.ValidationError; domain.ErrNotFound; *domain.StoreError; domain.ErrClosed.
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
	Type           domain.ResourceType // only the locks of this resource type
	Owner          string              // only this owner's locks
	IncludeExpired bool                // also locks expired but not yet purged
}

// List returns the locks matching opts, ordered by resource type and id.
// Errors: *domain.ValidationError; *domain.StoreError; domain.ErrClosed.
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

// apply decides in the gate, by OneStatement or Update, refusing late writes.
func (s *LockService) apply(ctx context.Context, owner string, ref domain.ResourceRef, ttl time.Duration,
	decide func(cur *domain.Lock, now, expires time.Time) (Change, error), one *Op) (Outcome, error) {
	ttl, err := s.checkInput(owner, ref, ttl)
	if err != nil {
		return Outcome{}, err
	}
	if err := s.gate.enter(); err != nil {
		return Outcome{}, err
	}
	defer s.gate.leave()
	var out Outcome
	if s.one != nil && one != nil {
		op := *one
		op.Owner, op.Ref, op.At = owner, ref, s.times(ttl)
		out, err = s.one.Apply(ctx, op)
	}
	if err == nil && out.Kind == ChangeNone { // undecided by a OneStatement store, or none
		out = Outcome{}
		// now is read with the row in hand, after any wait for writers.
		out.Lock, err = s.repo.Update(ctx, ref, func(cur *domain.Lock) (Change, error) {
			now, expires := s.times(ttl)()
			c, err := decide(cur, now, expires)
			out = Outcome{Kind: c.Kind}
			if c.Kind == ChangeInsert {
				out.Previous = cur
			}
			return c, err
		})
	}
	if err == nil && out.Previous != nil {
		s.holders.poke(ref) // a handle of this service may have held what was taken over
	}
	if err == nil {
		err = lateWrite(out.Lock, owner, ref, s.Now())
	}
	if err != nil {
		out.Lock = domain.Lock{}
	}
	return out, err
}

// times reads now on the service's clock, and the expiry now+ttl.
func (s *LockService) times(ttl time.Duration) func() (time.Time, time.Time) {
	return func() (time.Time, time.Time) {
		now := s.Now()
		return now, now.Add(ttl).Truncate(Precision)
	}
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

func (s *LockService) observe(ctx context.Context, e Event) {
	if s.observer != nil {
		s.observer.Observe(ctx, e)
	}
}

// started reads the clock for an event's Took, if anyone observes.
func (s *LockService) started() time.Time {
	if s.observer == nil {
		return time.Time{}
	}
	return s.clock.Now()
}

func (s *LockService) observeWait(ctx context.Context, owner string, ref domain.ResourceRef, start time.Time, l domain.Lock, err error) {
	if s.observer != nil && !errors.Is(err, domain.ErrClosed) {
		s.observer.Observe(ctx, Event{Kind: EventWaited, Owner: owner, Resource: ref, Lock: l,
			Took: s.clock.Now().Sub(start), Err: err})
	}
}

// observeRenewal reports a renewal that got past validation and Close.
func (s *LockService) observeRenewal(ctx context.Context, owner string, ref domain.ResourceRef, l domain.Lock, err error) {
	if s.observer != nil && !errors.Is(err, domain.ErrValidation) && !errors.Is(err, domain.ErrClosed) {
		e := Event{Kind: EventRenewed, Owner: owner, Resource: ref, Lock: l}
		if err != nil {
			e.Kind, e.Err = EventRenewFailed, err
		}
		s.observer.Observe(ctx, e)
	}
}
