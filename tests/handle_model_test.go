package tests

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/adapters/sqlite"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
	"github.com/cleveragents/locks/locktest/testclock"
)

// The handle model: a handle is one acquisition, and nothing it tells its
// holder may be false. Random sequences of Take (waiting or not, several
// owners, two handles of one owner), Renew, keep-alive renewals, Release,
// Do, removals behind the holder's back, takeovers by another process,
// pauses past the TTL and Close run against a small model: the store as a
// map resource -> (token, owner, expiry) and the set of live handles.
// After every step, every handle's claim is checked against the store.
//
// Run longer with -rapid.checks=N -rapid.steps=M (docs/reliability.md).

// hmRow is a stored lock as the model knows it.
type hmRow struct {
	token   int64
	owner   string
	expires time.Time
}

// hmHandle is a handle the model follows.
type hmHandle struct {
	id       int
	h        *application.Handle
	owner    string
	ref      domain.ResourceRef
	token    int64
	ttl      time.Duration
	released bool            // released, or its service closed
	kept     bool            // KeepAlive started
	held     context.Context // KeepAlive's context
	next     time.Time       // when the keep-alive's next renewal is due
	ended    bool            // the keep-alive has ended with a loss
	lost     bool            // the handle was told its lock is lost
	unasked  bool            // never asked Lost by Check, never kept alive
}

// The TTLs of handles are a few nanoseconds off whole seconds, so that
// their renewal interval (TTL/2, not a whole microsecond) is told apart
// from every other timer the service sets (guards at an expiry, polls of
// a waiter), which are whole microseconds or shorter than a second.
var (
	hmTTLs     = []time.Duration{10*time.Second + 2, 20*time.Second + 2}
	hmRefs     = []domain.ResourceRef{{Type: domain.ResourcePlan, ID: "p1"}, {Type: domain.ResourceProject, ID: "p1"}}
	hmOwners   = []string{"alice", "bob"} // the owners of this process's handles
	hmOther    = "zed"                    // the owner of another process
	hmStart    = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	errHMBoom  = errors.New("the work failed")
	hmWaitTime = 20 * time.Second // bound on waiting for an event, never reached unless something is wrong
)

// tickKey is a timer the model expects a keep-alive to set: its due time
// and length.
type tickKey struct {
	at time.Time
	d  time.Duration
}

// hmMachine drives one service ("this process", svc) and another on the
// same store ("another process", other) against the model.
type hmMachine struct {
	ctx     context.Context
	clk     *testclock.Clock // moved only by the model
	repo    application.LockRepository
	svc     *application.LockService
	other   *application.LockService
	rows    map[domain.ResourceRef]hmRow
	last    int64 // the largest token given so far
	handles []*hmHandle
	guards  map[time.Duration]bool // the lengths of the keep-alives' guard timers
	steps   *int
}

func (m *hmMachine) now() time.Time { return m.other.Now() }

func hmExpiry(now time.Time, ttl time.Duration) time.Time {
	return now.Add(ttl).Truncate(application.Precision)
}

// waitFor waits for cond, an event the step caused, and fails with what
// if it does not come: the bound is a safety net, not a timing claim.
func waitFor(t *rapid.T, cond func() bool, what string, args ...any) {
	deadline := time.Now().Add(hmWaitTime)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: "+what, append([]any{hmWaitTime}, args...)...)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// valid reports whether hs's lock is the stored one and unexpired now.
func (m *hmMachine) valid(hs *hmHandle, now time.Time) bool {
	row, ok := m.rows[hs.ref]
	return ok && row.token == hs.token && now.Before(row.expires)
}

// holder returns the live handle that holds ref now, if any.
func (m *hmMachine) holder(ref domain.ResourceRef, now time.Time) *hmHandle {
	for _, hs := range m.handles {
		if !hs.released && hs.ref == ref && m.valid(hs, now) {
			return hs
		}
	}
	return nil
}

// stale reports whether a live handle on ref has lost its lock: whether a
// new Take of ref may still be refused for it is the service's choice.
func (m *hmMachine) stale(ref domain.ResourceRef, now time.Time) bool {
	for _, hs := range m.handles {
		if !hs.released && hs.ref == ref && !m.valid(hs, now) {
			return true
		}
	}
	return false
}

func (m *hmMachine) live() []*hmHandle {
	var out []*hmHandle
	for _, hs := range m.handles {
		if !hs.released {
			out = append(out, hs)
		}
	}
	return out
}

func (m *hmMachine) pickLive(t *rapid.T, match func(*hmHandle) bool) *hmHandle {
	var c []*hmHandle
	for _, hs := range m.live() {
		if match == nil || match(hs) {
			c = append(c, hs)
		}
	}
	if len(c) == 0 {
		t.Skip("no such handle")
	}
	return c[rapid.IntRange(0, len(c)-1).Draw(t, "handle")]
}

// newToken checks a token the store just gave.
func (m *hmMachine) newToken(t *rapid.T, op string, token int64) {
	if token <= m.last {
		t.Fatalf("%s: new token %d is not larger than every earlier one (%d)", op, token, m.last)
	}
	m.last = token
}

// adopt records hs, just taken.
func (m *hmMachine) adopt(t *rapid.T, op string, h *application.Handle, owner string, ref domain.ResourceRef, ttl time.Duration, now time.Time) *hmHandle {
	l := h.Lock()
	m.newToken(t, op, l.Token)
	if l.Owner != owner || l.Resource != ref || !l.ExpiresAt.Equal(hmExpiry(now, ttl)) {
		t.Fatalf("%s: got %+v, want owner %q on %s expiring at %s", op, l, owner, ref, hmExpiry(now, ttl))
	}
	hs := &hmHandle{id: len(m.handles), h: h, owner: owner, ref: ref, token: l.Token, ttl: ttl}
	// A handle that never asks (no Lost after each step, no keep-alive)
	// learns of a loss only from its next Renew or Release, from the
	// store: the path a renewal by owner instead of token would get wrong.
	hs.unasked = op == "Take" && rapid.Bool().Draw(t, "unasked")
	m.handles = append(m.handles, hs)
	m.rows[ref] = hmRow{token: l.Token, owner: owner, expires: l.ExpiresAt}
	return hs
}

// reasons are the true reasons why hs's lock, which the handle believed
// to expire at believed, is lost at now.
func (m *hmMachine) reasons(hs *hmHandle, believed, now time.Time) []domain.LostReason {
	row, ok := m.rows[hs.ref]
	switch {
	case ok && row.token != hs.token && now.Before(row.expires):
		return []domain.LostReason{domain.LostTakenOver}
	case ok && row.token != hs.token:
		// Another acquisition, expired too: it took the resource over,
		// and the handle's lock was removed before, or had expired.
		return []domain.LostReason{domain.LostTakenOver, domain.LostRemoved, domain.LostExpired}
	case ok || !now.Before(believed):
		return []domain.LostReason{domain.LostExpired}
	}
	return []domain.LostReason{domain.LostRemoved}
}

// checkLoss checks that err reports the loss of hs's lock, with the true
// reason at now.
func (m *hmMachine) checkLoss(t *rapid.T, op string, hs *hmHandle, err error, believed, now time.Time, closed bool) {
	var lost *domain.LockLostError
	if !errors.As(err, &lost) {
		t.Fatalf("%s of handle %d (owner %q, token %d on %s), whose lock is lost (store: %v): got %T %v; want a *domain.LockLostError",
			op, hs.id, hs.owner, hs.token, hs.ref, m.rowString(hs.ref), err, err)
	}
	if lost.Lock.Token != hs.token {
		t.Fatalf("%s of handle %d: the loss names token %d, the handle's is %d", op, hs.id, lost.Lock.Token, hs.token)
	}
	told := hs.lost
	hs.lost = true
	want := m.reasons(hs, believed, now)
	if closed {
		want = append(want, domain.LostClosed)
	}
	// A handle told of its loss before may repeat the reason it was told
	// then, which may since have stopped being the latest news.
	if !told && !slices.Contains(want, lost.Reason) {
		t.Fatalf("%s of handle %d (token %d, believed to expire at %s, now %s, store %v): reason %q, want one of %v (%v)",
			op, hs.id, hs.token, believed, now, m.rowString(hs.ref), lost.Reason, want, lost)
	}
	if lost.Reason == domain.LostTakenOver {
		row := m.rows[hs.ref]
		if lost.NewHolder == nil || !told && lost.NewHolder.Token != row.token {
			t.Fatalf("%s of handle %d: taken over, new holder %v, the store holds token %d", op, hs.id, lost.NewHolder, row.token)
		}
		if lost.Lock.ExpiresAt.After(lost.At) && strings.Contains(lost.Error(), "after it expired at") {
			t.Fatalf("%s of handle %d: the loss says the lock expired at %s, which is after the loss at %s: %v",
				op, hs.id, lost.Lock.ExpiresAt, lost.At, lost)
		}
	}
}

func (m *hmMachine) rowString(ref domain.ResourceRef) string {
	row, ok := m.rows[ref]
	if !ok {
		return "no lock"
	}
	return fmt.Sprintf("token %d of %q until %s", row.token, row.owner, row.expires)
}

// Check compares the store with the model and every handle's claim with
// the store, after every step.
func (m *hmMachine) Check(t *rapid.T) {
	*m.steps++
	now := m.now()
	for _, ref := range hmRefs {
		got, err := m.other.Get(m.ctx, ref)
		row, ok := m.rows[ref]
		switch {
		case !ok && errors.Is(err, domain.ErrNotFound):
		case !ok || err != nil:
			t.Fatalf("stored lock on %s: got %+v, %v; model says %s", ref, got, err, m.rowString(ref))
		case got.Token != row.token || got.Owner != row.owner || !got.ExpiresAt.Equal(row.expires):
			t.Fatalf("stored lock on %s: got %+v; model says %s", ref, got, m.rowString(ref))
		}
	}
	claims := map[domain.ResourceRef][]int{}
	for _, hs := range m.handles {
		if l := hs.h.Lock(); l.Token != hs.token || l.Owner != hs.owner || l.Resource != hs.ref {
			t.Fatalf("handle %d was taken as token %d of %q on %s; it now says %+v: a handle never adopts another acquisition",
				hs.id, hs.token, hs.owner, hs.ref, l)
		}
		if hs.released || hs.unasked {
			continue
		}
		claim := hs.h.Lost(m.ctx)
		switch {
		case hs.ended && claim == nil:
			t.Fatalf("handle %d: its keep-alive ended with a loss, yet Lost says it holds the lock", hs.id)
		case claim == nil && (hs.lost || !m.valid(hs, now)):
			t.Fatalf("handle %d (owner %q, token %d on %s) is told it holds its lock; store: %v, told lost before: %v",
				hs.id, hs.owner, hs.token, hs.ref, m.rowString(hs.ref), hs.lost)
		case claim == nil:
			claims[hs.ref] = append(claims[hs.ref], hs.id)
		case m.valid(hs, now):
			t.Fatalf("handle %d (token %d on %s) holds its lock (store: %v), yet Lost says %v", hs.id, hs.token, hs.ref, m.rowString(hs.ref), claim)
		case !hs.ended:
			m.checkLoss(t, "Lost", hs, claim, hs.h.Lock().ExpiresAt, now, false)
		}
		if claim != nil && hs.kept && !hs.ended {
			// A loss that Lost found ends the keep-alive, as its own would.
			waitFor(t, func() bool { return finished(hs.h.Done()) }, "the keep-alive of handle %d ran on after Lost found its loss", hs.id)
			if !errors.Is(context.Cause(hs.held), hs.h.Err()) {
				t.Fatalf("handle %d: the keep-alive's context ended with %v, not with the loss %v", hs.id, context.Cause(hs.held), hs.h.Err())
			}
			hs.ended = true
		}
	}
	for ref, ids := range claims {
		if len(ids) > 1 {
			t.Fatalf("handles %v all claim to hold %s (store: %v)", ids, ref, m.rowString(ref))
		}
	}
}

// runHandleModel runs the model on the stores that open returns, one per
// check; the function it returns ends the check.
func runHandleModel(t *testing.T, open func(t *testing.T) (application.LockRepository, func())) {
	steps := 0
	start := time.Now()
	defer func() { t.Logf("%d steps in %s", steps, time.Since(start).Round(time.Millisecond)) }()
	rapid.Check(t, func(rt *rapid.T) {
		clk := testclock.New(hmStart)
		repo, closeRepo := open(t)
		defer closeRepo()
		svc, err := application.NewLockService(repo, clk, 0)
		if err != nil {
			rt.Fatal(err)
		}
		other, err := application.NewLockService(repo, clk, 0)
		if err != nil {
			rt.Fatal(err)
		}
		m := &hmMachine{ctx: context.Background(), clk: clk, repo: repo, svc: svc, other: other,
			rows: map[domain.ResourceRef]hmRow{}, guards: map[time.Duration]bool{}, steps: &steps}
		defer m.shutdown()
		rt.Repeat(rapid.StateMachineActions(m))
	})
}

// shutdown ends every handle's keep-alive, so that no goroutine outlives
// a check.
func (m *hmMachine) shutdown() {
	for _, hs := range m.live() {
		_, _ = hs.h.Release(m.ctx)
	}
	_ = m.svc.Close(m.ctx)
	_ = m.other.Close(m.ctx)
}

func TestHandleModel_Memory(t *testing.T) {
	runHandleModel(t, func(*testing.T) (application.LockRepository, func()) {
		return memory.NewLockRepository(), func() {}
	})
}

func TestHandleModel_SQLite(t *testing.T) {
	// One file for every check, emptied after each: opening and migrating
	// a file per check would cost more than the steps.
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "locks.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	repo := sqlite.NewLockRepository(db)
	runHandleModel(t, func(t *testing.T) (application.LockRepository, func()) {
		return repo, func() {
			for _, owner := range append([]string{hmOther}, hmOwners...) {
				if _, err := repo.DeleteAllOwned(context.Background(), owner); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
