package tests

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"pgregory.net/rapid"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/adapters/postgres"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/tests/testdb"
)

// The model: the lock rules restated as plainly as possible, independent of
// the service's code. Random sequences of operations and clock moves run
// against both, and every result, error kind and the whole stored state
// must agree after every step. Run longer with -rapid.checks=N -rapid.steps=M.

type modelLock struct {
	owner             string
	acquired, expires time.Time
	token             int64
}

type model struct {
	now   time.Time
	locks map[domain.ResourceRef]modelLock
	last  int64
	// postgres allows what PostgreSQL's READ COMMITTED statements do
	// under concurrency (see Concurrently): a new token only has to be
	// larger than every earlier one, since an acquire can use up an id of
	// the sequence when a concurrent write makes it fall back; and a
	// release that meets its owner's own takeover of the lock may find
	// nothing.
	postgres bool
}

// adopt makes token, larger than the one the model just gave, the token
// of the lock on ref and the last one given.
func (m *model) adopt(ref domain.ResourceRef, token int64) modelLock {
	l := m.locks[ref]
	l.token, m.last = token, token
	m.locks[ref] = l
	return l
}

func (m *model) active(ref domain.ResourceRef) (modelLock, bool) {
	l, ok := m.locks[ref]
	return l, ok && m.now.Before(l.expires)
}

func (m *model) acquire(owner string, ref domain.ResourceRef, ttl time.Duration) (modelLock, string) {
	if bad := m.invalid(owner, ref, ttl); bad != "" {
		return modelLock{}, bad
	}
	if l, ok := m.active(ref); ok {
		if l.owner != owner {
			return l, "conflict"
		}
		// A re-entry extends, never shortens: the later expiry stands.
		if e := m.now.Add(ttlOrDefault(ttl)); e.After(l.expires) {
			l.expires = e
		}
		m.locks[ref] = l
		return l, "ok"
	}
	m.last++
	l := modelLock{owner: owner, acquired: m.now, expires: m.now.Add(ttlOrDefault(ttl)), token: m.last}
	m.locks[ref] = l
	return l, "ok"
}

func (m *model) renew(owner string, ref domain.ResourceRef, ttl time.Duration) (modelLock, string) {
	if bad := m.invalid(owner, ref, ttl); bad != "" {
		return modelLock{}, bad
	}
	l, ok := m.active(ref)
	switch {
	case !ok:
		return modelLock{}, "expired"
	case l.owner != owner:
		return l, "conflict"
	}
	l.expires = m.now.Add(ttlOrDefault(ttl))
	m.locks[ref] = l
	return l, "ok"
}

func (m *model) release(owner string, ref domain.ResourceRef) (bool, string) {
	if bad := m.invalid(owner, ref, 0); bad != "" {
		return false, bad
	}
	if l, ok := m.locks[ref]; ok && l.owner == owner {
		delete(m.locks, ref)
		return true, "ok"
	}
	return false, "ok"
}

func (m *model) removeWhere(match func(modelLock) bool) int {
	n := 0
	for ref, l := range m.locks {
		if match(l) {
			delete(m.locks, ref)
			n++
		}
	}
	return n
}

func (m *model) stale() int {
	n := 0
	for _, l := range m.locks {
		if !m.now.Before(l.expires) {
			n++
		}
	}
	return n
}

func (m *model) invalid(owner string, ref domain.ResourceRef, ttl time.Duration) string {
	if owner == "" || ref.ID == "" || (ref.Type != "plan" && ref.Type != "project") ||
		(ttl != 0 && (ttl < 5*time.Second || ttl > time.Hour)) {
		return "validation"
	}
	return ""
}

func ttlOrDefault(ttl time.Duration) time.Duration {
	if ttl == 0 {
		return 300 * time.Second
	}
	return ttl
}

func kindOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, domain.ErrConflict):
		return "conflict"
	case errors.Is(err, domain.ErrExpired):
		return "expired"
	case errors.Is(err, domain.ErrValidation):
		return "validation"
	}
	return "unexpected: " + err.Error()
}

var (
	modelOwners = []string{"alice", "bob", "carol", ""}
	modelRefs   = []domain.ResourceRef{
		{Type: domain.ResourcePlan, ID: "p1"}, {Type: domain.ResourcePlan, ID: "p2"},
		{Type: domain.ResourceProject, ID: "p1"}, {Type: "task", ID: "p1"}, {Type: domain.ResourcePlan},
	}
	modelTTLs = []time.Duration{
		0, 5 * time.Second, 5*time.Second + 500*time.Millisecond, 7*time.Second + time.Microsecond,
		10 * time.Second, time.Hour, 5*time.Second - time.Microsecond, time.Hour + time.Microsecond, -time.Second,
	}
)

// machine drives the service and the model side by side.
type machine struct {
	ctx   context.Context
	svc   *application.LockService
	clock *clock.Mock
	model *model
	steps *int // counts the steps of the whole run, for the log
	spy   *acquireSpy
}

func (s *machine) pick(t *rapid.T) (string, domain.ResourceRef, time.Duration) {
	// Valid inputs most of the time, so that the interesting states occur.
	owner := rapid.SampledFrom(modelOwners[:3]).Draw(t, "owner")
	if rapid.IntRange(0, 20).Draw(t, "badOwner") == 0 {
		owner = ""
	}
	ref := rapid.SampledFrom(modelRefs[:3]).Draw(t, "ref")
	if rapid.IntRange(0, 20).Draw(t, "badRef") == 0 {
		ref = rapid.SampledFrom(modelRefs[3:]).Draw(t, "ref")
	}
	return owner, ref, rapid.SampledFrom(modelTTLs).Draw(t, "ttl")
}

func (s *machine) checkLock(t *rapid.T, op string, got domain.Lock, want modelLock, ref domain.ResourceRef) {
	if got.Owner != want.owner || got.Token != want.token || got.Resource != ref ||
		!got.AcquiredAt.Equal(want.acquired) || !got.ExpiresAt.Equal(want.expires) {
		t.Fatalf("%s: got %+v, model says %+v", op, got, want)
	}
}

func (s *machine) Acquire(t *rapid.T) {
	owner, ref, ttl := s.pick(t)
	before, held := s.model.active(ref)
	s.spy.reset()
	got, err := s.svc.Acquire(s.ctx, owner, ref, ttl)
	last := s.model.last
	want, kind := s.model.acquire(owner, ref, ttl)
	if s.model.postgres && kind == "ok" && s.model.last > last && got.Token > want.token {
		want = s.model.adopt(ref, got.Token)
	}
	s.compare(t, "acquire", kind, err, got, want, ref)
	// The model agreed with the store's own acquire (the SQL rule), or
	// with Update (the Go rule) where the store left it the decision:
	// only for a re-entry near the lock's expiry.
	if s.spy.wasUndecided() && !(held && before.owner == owner && before.expires.Sub(s.model.now) < time.Second) {
		t.Fatalf("acquire: the store left to Update a decision it should take itself: %+v by %s at %s", before, owner, s.model.now)
	}
}

// acquireSpy is a store that acquires and renews by itself, counting how
// often it left the decision to Update; it leaves every other Op to
// Update. Concurrently calls it from several goroutines at once.
type acquireSpy struct {
	application.LockRepository
	one application.OneStatement

	mu                 sync.Mutex // Concurrently calls it from several goroutines
	undecided, decided int
	renewed            int  // extensions the store's own renew made
	last               bool // the last call was left undecided
}

func (a *acquireSpy) Apply(ctx context.Context, op application.Op) (application.Outcome, error) {
	if op.Kind != application.OpAcquire && op.Kind != application.OpRenew {
		return application.Outcome{}, nil
	}
	got, err := a.one.Apply(ctx, op)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = err == nil && got.Kind == application.ChangeNone
	switch {
	case op.Kind == application.OpRenew:
		if err == nil && !a.last {
			a.renewed++
		}
	case a.last:
		a.undecided++
	default:
		a.decided++
	}
	return got, err
}

func (a *acquireSpy) reset() {
	if a != nil {
		a.mu.Lock()
		a.last = false
		a.mu.Unlock()
	}
}

func (a *acquireSpy) wasUndecided() bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

func (s *machine) Renew(t *rapid.T) {
	owner, ref, ttl := s.pick(t)
	before, _ := s.model.active(ref)
	s.spy.reset()
	got, err := s.svc.Renew(s.ctx, owner, ref, ttl)
	want, kind := s.model.renew(owner, ref, ttl)
	s.compare(t, "renew", kind, err, got, want, ref)
	// An extension is the store's own (the SQL rule), but for a lock near
	// its expiry, which the store checks at the time of its write.
	if kind == "ok" && s.spy.wasUndecided() && before.expires.Sub(s.model.now) >= time.Second {
		t.Fatalf("renew: the store left to Update an extension it should make itself: %+v by %s at %s", before, owner, s.model.now)
	}
}

func (s *machine) compare(t *rapid.T, op, kind string, err error, got domain.Lock, want modelLock, ref domain.ResourceRef) {
	if k := kindOf(err); k != kind {
		t.Fatalf("%s: got %s (%v), model says %s", op, k, err, kind)
	}
	switch kind {
	case "ok":
		s.checkLock(t, op, got, want, ref)
	case "conflict":
		var ce *domain.LockConflictError
		if !errors.As(err, &ce) {
			t.Fatalf("%s: conflict is not a *LockConflictError: %T", op, err)
		}
		s.checkLock(t, op+" holder", ce.Holder, want, ref)
	}
}

func (s *machine) Release(t *rapid.T) {
	owner, ref, _ := s.pick(t)
	got, err := s.svc.Release(s.ctx, owner, ref)
	want, kind := s.model.release(owner, ref)
	if k := kindOf(err); k != kind || got != want {
		t.Fatalf("release: got (%v, %s), model says (%v, %s)", got, k, want, kind)
	}
}

func (s *machine) ReleaseAll(t *rapid.T) {
	owner := rapid.SampledFrom(modelOwners[:3]).Draw(t, "owner")
	got, err := s.svc.ReleaseAllForOwner(s.ctx, owner)
	want := s.model.removeWhere(func(l modelLock) bool { return l.owner == owner })
	if err != nil || got != want {
		t.Fatalf("release-all: got (%d, %v), model says %d", got, err, want)
	}
}

func (s *machine) Cleanup(t *rapid.T) {
	got, err := s.svc.CleanupExpired(s.ctx)
	now := s.model.now
	want := s.model.removeWhere(func(l modelLock) bool { return !now.Before(l.expires) })
	if err != nil || got != want {
		t.Fatalf("cleanup: got (%d, %v), model says %d", got, err, want)
	}
}

func (s *machine) Advance(t *rapid.T) {
	d := time.Duration(rapid.Int64Range(0, 12_000_000).Draw(t, "advanceMicros")) * time.Microsecond
	s.clock.Add(d)
	s.model.now = s.model.now.Add(d)
}

// AdvanceToExpiry lands exactly on a stored lock's expiry, or just before
// it: the instants where an off-by-one in "expired" would show.
func (s *machine) AdvanceToExpiry(t *rapid.T) {
	var future []time.Time
	for _, l := range s.model.locks {
		if l.expires.After(s.model.now) {
			future = append(future, l.expires)
		}
	}
	if len(future) == 0 {
		t.Skip("no lock expires in the future")
	}
	slices.SortFunc(future, time.Time.Compare)
	to := rapid.SampledFrom(future).Draw(t, "expiry")
	if rapid.Bool().Draw(t, "justBefore") {
		to = to.Add(-time.Microsecond)
	}
	s.clock.Set(to)
	s.model.now = to
}

// Check compares the whole stored state after every step.
func (s *machine) Check(t *rapid.T) {
	*s.steps++
	if got, want := s.stored(t), s.model.state(); got != want {
		t.Fatalf("stored state differs from the model:\n got  %v\n want %v", got, want)
	}
	stale, err := s.svc.StaleCount(s.ctx)
	if err != nil || stale != s.model.stale() {
		t.Fatalf("stale count: got (%d, %v), model says %d", stale, err, s.model.stale())
	}
}

// stored returns every stored lock, printed.
func (s *machine) stored(t *rapid.T) string {
	all, err := s.svc.List(s.ctx, application.ListOptions{IncludeExpired: true})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	return fmt.Sprint(all)
}

// state returns the locks of the model, printed as stored returns them.
func (m *model) state() string {
	var want []domain.Lock
	for ref, l := range m.locks {
		want = append(want, domain.Lock{Token: l.token, Owner: l.owner, Resource: ref, AcquiredAt: l.acquired, ExpiresAt: l.expires})
	}
	slices.SortFunc(want, func(a, b domain.Lock) int {
		return cmp.Or(cmp.Compare(a.Resource.Type, b.Resource.Type), cmp.Compare(a.Resource.ID, b.Resource.ID))
	})
	return fmt.Sprint(want)
}

// runModel runs the model against the stores that newRepo opens, one per
// check; the returned function closes it.
func runModel(t *testing.T, newRepo func(t *testing.T) (application.LockRepository, func())) {
	steps, decided, undecided, renewed := 0, 0, 0, 0
	defer func() { t.Logf("%d steps compared with the model", steps) }()
	rapid.Check(t, func(rt *rapid.T) {
		mc := clock.NewMock()
		start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Add(time.Duration(rapid.Int64Range(0, 999_999).Draw(rt, "startMicros")) * time.Microsecond)
		mc.Set(start)
		repo, closeRepo := newRepo(t)
		defer closeRepo()
		svc, err := application.NewLockService(repo, mc, 0)
		if err != nil {
			rt.Fatal(err)
		}
		m := &machine{ctx: context.Background(), svc: svc, clock: mc, steps: &steps,
			model: &model{now: start, locks: map[domain.ResourceRef]modelLock{}}}
		m.spy, _ = repo.(*acquireSpy)
		m.model.postgres = m.spy != nil
		rt.Repeat(rapid.StateMachineActions(m))
		if m.spy != nil {
			decided += m.spy.decided
			undecided += m.spy.undecided
			renewed += m.spy.renewed
		}
	})
	if decided+undecided > 0 {
		t.Logf("the store's own acquire decided %d times, left %d to Update; its own renew extended %d times", decided, undecided, renewed)
	}
}

func TestModel_SQLite(t *testing.T) {
	var shared int64
	runModel(t, func(t *testing.T) (application.LockRepository, func()) {
		db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "locks.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return sqlite.NewLockRepository(db), func() {
			shared += db.WriteStats().Shared
			db.Close()
		}
	})
	// Concurrently must have put writes into shared transactions, or the
	// model never checked group commit.
	t.Logf("%d writes shared a transaction", shared)
	if shared == 0 && !t.Failed() {
		t.Fatal("no write shared a transaction with another: group commit was not exercised")
	}
}

func TestModel_PostgreSQL(t *testing.T) {
	testdb.Postgres(t) // skip at once without a server
	var shared int64
	runModel(t, func(t *testing.T) (application.LockRepository, func()) {
		db, err := postgres.Open(context.Background(), testdb.Postgres(t), postgres.Options{MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		// The store acquires and renews in one statement: the spy checks
		// that it takes those decisions itself, so that they are the ones
		// the model checks.
		repo := postgres.NewLockRepository(db)
		return &acquireSpy{LockRepository: repo, one: repo}, func() {
			shared += repo.WriteStats().Shared
			db.Close()
		}
	})
	// As on SQLite: Concurrently must have put writes into shared batches.
	t.Logf("%d writes shared a statement", shared)
	if shared == 0 && !t.Failed() {
		t.Fatal("no write shared a statement with another: group commit was not exercised")
	}
}

func TestModel_Memory(t *testing.T) {
	runModel(t, func(*testing.T) (application.LockRepository, func()) { return memory.NewLockRepository(), func() {} })
}
