package tests

import (
	"context"
	"errors"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

// The steps of the handle model (handle_model_test.go).

func (m *hmMachine) draw(t *rapid.T) (string, domain.ResourceRef, time.Duration) {
	return rapid.SampledFrom(hmOwners).Draw(t, "owner"), rapid.SampledFrom(hmRefs).Draw(t, "ref"),
		rapid.SampledFrom(hmTTLs).Draw(t, "ttl")
}

// Take takes a handle, waiting or not. A resource held by a live handle
// of the same service is refused, whatever the owner; one held by another
// owner is refused.
func (m *hmMachine) Take(t *rapid.T) {
	owner, ref, ttl := m.draw(t)
	wait := rapid.Bool().Draw(t, "wait")
	now := m.now()
	row, active := m.rows[ref]
	active = active && now.Before(row.expires)
	holder := m.holder(ref, now)
	switch {
	case wait && holder != nil:
		m.takeBehind(t, owner, ref, ttl, holder)
		return
	case wait && (active || m.stale(ref, now)):
		t.Skip("the wait would be for another process's lock, or for a handle that lost its lock")
	}
	h, err := m.svc.Take(m.ctx, owner, ref, application.AcquireOptions{TTL: ttl, Wait: wait})
	var conflict *domain.LockConflictError
	switch {
	case holder != nil && err == nil:
		t.Fatalf("Take by %q of %s succeeded (token %d) while handle %d (owner %q, token %d) holds it: two handles must never hold one resource",
			owner, ref, h.Lock().Token, holder.id, holder.owner, holder.token)
	case holder != nil:
		if !errors.As(err, &conflict) {
			t.Fatalf("Take by %q of %s, held by handle %d: got %T %v; want a *domain.LockConflictError", owner, ref, holder.id, err, err)
		}
	case active:
		// A live handle that lost its lock may be named instead of the
		// store's holder: it still keeps others of this process out.
		// A lock of the same owner that no live handle holds (an
		// owner-scoped Acquire, a handle's lock renewed behind its back)
		// is refused too: a handle never shares another acquisition.
		if !errors.As(err, &conflict) || conflict.Holder.Token != row.token && !m.stale(ref, now) {
			t.Fatalf("Take by %q of %s held by %v: got %v; want a conflict naming the holder", owner, ref, m.rowString(ref), err)
		}
		if conflict.Holder.Token == row.token && !conflict.InProcess && conflict.SameOwner != (row.owner == owner) {
			t.Fatalf("Take by %q of %s held by %v: SameOwner is %v", owner, ref, m.rowString(ref), conflict.SameOwner)
		}
	case err != nil && m.stale(ref, now) && errors.As(err, &conflict):
		// A live handle that lost its lock may still keep others out.
	case err != nil:
		t.Fatalf("Take by %q of free %s: %v", owner, ref, err)
	default:
		m.adopt(t, "Take", h, owner, ref, ttl, now)
	}
}

// takeBehind takes ref, held by holder, waiting: the Take waits its turn
// until the holder releases, whatever its owner, and then gets a lock of
// its own.
func (m *hmMachine) takeBehind(t *rapid.T, owner string, ref domain.ResourceRef, ttl time.Duration, holder *hmHandle) {
	type taken struct {
		h   *application.Handle
		err error
	}
	out := make(chan taken, 1)
	go func() {
		h, err := m.svc.Take(m.ctx, owner, ref, application.AcquireOptions{TTL: ttl, Wait: true})
		out <- taken{h, err}
	}()
	var early *taken
	waitFor(t, func() bool {
		select {
		case got := <-out:
			early = &got
			return true
		default:
			return m.svc.Waiting(ref) == 1
		}
	}, "Take(Wait) by %q of %s neither waited nor returned", owner, ref)
	if early != nil {
		tok := int64(0)
		if early.h != nil {
			tok = early.h.Lock().Token
			_, _ = early.h.Release(m.ctx) // never the holder's: the check below fails the run anyway
		}
		t.Fatalf("Take(Wait) by %q of %s returned at once (token %d, %v) while handle %d (owner %q, token %d) holds it: it must wait its turn",
			owner, ref, tok, early.err, holder.id, holder.owner, holder.token)
	}
	m.release(t, holder)
	var got taken
	waitFor(t, func() bool {
		select {
		case got = <-out:
			return true
		default:
			return false
		}
	}, "the waiter for %s was not handed the lock its holder released", ref)
	if got.err != nil {
		t.Fatalf("Take(Wait) by %q of %s, released by handle %d: %v", owner, ref, holder.id, got.err)
	}
	m.adopt(t, "Take(Wait)", got.h, owner, ref, ttl, m.now())
}

// Renew renews a handle's lock by hand: only the handle's own, unexpired
// lock is extended; any other state is a loss with its true reason.
func (m *hmMachine) Renew(t *rapid.T) {
	hs := m.pickLive(t, nil)
	now, believed := m.now(), hs.h.Lock().ExpiresAt
	valid := m.valid(hs, now)
	l, err := hs.h.Renew(m.ctx)
	if !valid {
		if err == nil {
			t.Fatalf("Renew of handle %d (token %d on %s) succeeded, as %+v, though its lock is lost (store: %v)",
				hs.id, hs.token, hs.ref, l, m.rowString(hs.ref))
		}
		m.checkLoss(t, "Renew", hs, err, believed, now, false)
		return
	}
	if err != nil || l.Token != hs.token || !l.ExpiresAt.Equal(hmExpiry(now, hs.ttl)) {
		t.Fatalf("Renew of handle %d, which holds its lock: got %+v, %v", hs.id, l, err)
	}
	row := m.rows[hs.ref]
	row.expires = l.ExpiresAt
	m.rows[hs.ref] = row
}

// KeepAlive starts a handle's keep-alive.
func (m *hmMachine) KeepAlive(t *rapid.T) {
	hs := m.pickLive(t, func(hs *hmHandle) bool { return !hs.kept && !hs.unasked })
	if known := hs.h.Err(); known != nil {
		// The handle knows its lock is lost (Check asks Lost after every
		// step): the keep-alive ends at once, with that loss, and renews
		// nothing.
		hs.held = hs.h.KeepAlive(m.ctx)
		hs.kept, hs.ended = true, true
		if !finished(hs.h.Done()) || !errors.Is(context.Cause(hs.held), known) {
			t.Fatalf("KeepAlive of handle %d, which knows it lost its lock (%v): done %v, context cause %v",
				hs.id, known, finished(hs.h.Done()), context.Cause(hs.held))
		}
		return
	}
	// The first renewal is due TTL/2 away, or at half of what is left of
	// a lock that has less than that; one with nothing left is declared
	// lost at once (TestHandle_KeepAliveOfALateLock), which this model,
	// whose keep-alives act only when the clock moves, does not follow.
	first := domain.RenewInterval(hs.ttl)
	if left := hs.h.Lock().ExpiresAt.Sub(m.clk.Now()); left < first { // from the clock as it reads, as the keep-alive measures
		if left/2 <= 0 {
			t.Skip("the keep-alive of a lock past its expiry ends at once")
		}
		first = left / 2
	}
	hs.next = m.clk.Now().Add(first) // the timer's time, not the service's instant
	armed := m.arming(tickKey{at: hs.next, d: first})
	hs.held = hs.h.KeepAlive(m.ctx)
	hs.kept = true
	armed(t)
}

// renewalKey is the renewal timer of hs's keep-alive, due at at.
func renewalKey(hs *hmHandle, at time.Time) tickKey {
	return tickKey{at: at, d: domain.RenewInterval(hs.ttl)}
}

// arming returns the function that waits until a keep-alive has set each
// of the renewal timers keys, so that moving the clock later fires them:
// until each is pending on the clock, due at its time and set since the
// clock last moved (its whole length ahead). Timers of the same time and
// length pending before (by a keep-alive that has stopped since) do not
// count.
func (m *hmMachine) arming(keys ...tickKey) func(t *rapid.T) {
	want := map[tickKey]int{}
	for _, k := range keys {
		if _, ok := want[k]; !ok {
			want[k] = m.pending(k)
		}
		want[k]++
	}
	return func(t *rapid.T) {
		for k, n := range want {
			waitFor(t, func() bool { return m.pending(k) >= n },
				"a keep-alive did not set its renewal timer for %s", k.at)
		}
	}
}

// pending returns how many timers pending on the clock are due at k.at,
// k.d ahead: the model alone moves the clock, so Now and PendingIn agree.
func (m *hmMachine) pending(k tickKey) int {
	now, n := m.clk.Now(), 0
	for _, in := range m.clk.PendingIn() {
		if in == k.d && now.Add(in).Equal(k.at) {
			n++
		}
	}
	return n
}

// Advance moves the clock: a little, to just past the next renewal due,
// or past a lock's expiry (a pause), firing every timer due by then.
func (m *hmMachine) Advance(t *rapid.T) {
	now := m.clk.Now()
	var d time.Duration
	switch rapid.IntRange(0, 2).Draw(t, "how") {
	case 0:
		d = time.Duration(rapid.Int64Range(1, 3_000_000).Draw(t, "micros")) * time.Microsecond
	case 1:
		var due []time.Time
		for _, hs := range m.live() {
			if hs.kept && !hs.ended {
				due = append(due, hs.next)
			}
		}
		if len(due) == 0 {
			t.Skip("no keep-alive runs")
		}
		d = rapid.SampledFrom(due).Draw(t, "due").Sub(now) +
			time.Duration(rapid.Int64Range(0, 500_000).Draw(t, "jitterMicros"))*time.Microsecond
	default:
		d = time.Duration(rapid.Int64Range(10, 45).Draw(t, "pauseSeconds")) * time.Second
	}
	m.moveTo(t, now.Add(max(d, time.Microsecond)))
}

// moveTo sets the clock to at and settles every keep-alive that was due:
// each renews a lock it still holds, and ends with the true loss
// otherwise.
func (m *hmMachine) moveTo(t *rapid.T, at time.Time) {
	type due struct {
		hs       *hmHandle
		valid    bool
		believed time.Time
	}
	var fired []due
	for _, hs := range m.live() {
		if hs.kept && !hs.ended && !hs.next.After(at) {
			fired = append(fired, due{hs, m.valid(hs, at), hs.h.Lock().ExpiresAt})
		}
	}
	var next []tickKey
	for _, f := range fired {
		if f.valid {
			next = append(next, renewalKey(f.hs, at.Add(domain.RenewInterval(f.hs.ttl))))
		}
	}
	armed := m.arming(next...)
	// The store never fails in this model: a keep-alive renews or ends,
	// and sets no timer but its guard at the old expiry and its next
	// renewal. Any other is a retry, of a refusal taken for a transient
	// failure: it would wait for a clock that does not move.
	// A guard waits from the clock's reading to the old expiry; its
	// goroutine may set it late, during a later step.
	for _, f := range fired {
		m.guards[f.believed.Sub(at)] = true
	}
	for drained := false; !drained; { // the timers set before the move
		select {
		case <-m.clk.Timers():
		default:
			drained = true
		}
	}
	noRetry := func() {
		for {
			select {
			case d := <-m.clk.Timers():
				if !m.guards[d] && !slices.Contains(hmTTLs, 2*d) {
					t.Fatalf("a keep-alive set a timer of %s when the clock reached %s: a retry, though the store never failed", d, at)
				}
			default:
				return
			}
		}
	}
	m.clk.Set(at)  // fires every timer due by then
	m.clk.Resume() // or, after a pause, once the time has moved
	now := m.now()
	for _, f := range fired {
		hs := f.hs
		renewed := func() bool { return hs.h.Lock().ExpiresAt.After(f.believed) }
		waitFor(t, func() bool { noRetry(); return renewed() || finished(hs.h.Done()) },
			"the keep-alive of handle %d (due %s) neither renewed nor ended when the clock reached %s", hs.id, hs.next, now)
		switch {
		case f.valid && !renewed():
			t.Fatalf("the keep-alive of handle %d (token %d on %s) ended though its lock was held (store: %v): %v",
				hs.id, hs.token, hs.ref, m.rowString(hs.ref), hs.h.Err())
		case f.valid:
			if got, want := hs.h.Lock().ExpiresAt, hmExpiry(now, hs.ttl); !got.Equal(want) {
				t.Fatalf("the keep-alive of handle %d renewed to %s, want %s", hs.id, got, want)
			}
			row := m.rows[hs.ref]
			row.expires = hs.h.Lock().ExpiresAt
			m.rows[hs.ref] = row
			hs.next = at.Add(domain.RenewInterval(hs.ttl))
		case renewed():
			t.Fatalf("the keep-alive of handle %d (token %d on %s) renewed a lock it had lost (store: %v): now %+v",
				hs.id, hs.token, hs.ref, m.rowString(hs.ref), hs.h.Lock())
		default:
			hs.ended = true
			m.checkLoss(t, "the keep-alive", hs, hs.h.Err(), f.believed, now, false)
			if !errors.Is(context.Cause(hs.held), hs.h.Err()) {
				t.Fatalf("handle %d: the keep-alive's context ended with %v, not with the loss %v", hs.id, context.Cause(hs.held), hs.h.Err())
			}
		}
	}
	armed(t)
}

func finished(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Release releases a handle: it removes its own lock and nothing else.
func (m *hmMachine) Release(t *rapid.T) {
	m.release(t, m.pickLive(t, nil))
}

func (m *hmMachine) release(t *rapid.T, hs *hmHandle) {
	now, believed := m.now(), hs.h.Lock().ExpiresAt
	row, ok := m.rows[hs.ref]
	own := ok && row.token == hs.token
	removed, err := hs.h.Release(m.ctx)
	hs.released = true
	if hs.kept && !finished(hs.h.Done()) {
		t.Fatalf("Release of handle %d returned before its keep-alive ended", hs.id)
	}
	switch {
	case own && now.Before(row.expires):
		if !removed || err != nil {
			t.Fatalf("Release of handle %d, which holds its lock: got %v, %v", hs.id, removed, err)
		}
		delete(m.rows, hs.ref)
	case own: // expired, not yet taken: the release may remove it
		if err != nil {
			m.checkLoss(t, "Release", hs, err, believed, now, false)
		}
		if _, gerr := m.other.Get(m.ctx, hs.ref); errors.Is(gerr, domain.ErrNotFound) {
			delete(m.rows, hs.ref)
		}
	case removed:
		t.Fatalf("Release of handle %d (token %d on %s) removed a lock, though the store held %v", hs.id, hs.token, hs.ref, m.rowString(hs.ref))
	case err != nil:
		m.checkLoss(t, "Release", hs, err, believed, now, false)
	}
}

// Do runs a function under a new lock; behind its back, the lock may be
// removed, or the process paused past the TTL while another takes it.
// Do returns every loss, and releases only its own lock.
func (m *hmMachine) Do(t *rapid.T) {
	owner, ref, ttl := m.draw(t)
	behind := rapid.SampledFrom([]string{"nothing", "fail", "remove", "pause-and-takeover"}).Draw(t, "behind")
	now := m.now()
	row, active := m.rows[ref]
	active = active && now.Before(row.expires)
	holder := m.holder(ref, now)
	if holder == nil && active && row.owner == owner {
		t.Skip("an owner-scoped lock of the same owner")
	}
	var (
		ran  bool
		mine domain.Lock
		took domain.Lock
	)
	err := m.svc.Do(m.ctx, owner, ref, application.AcquireOptions{TTL: ttl}, func(ctx context.Context, l domain.Lock) error {
		ran, mine = true, l
		if holder != nil || active {
			return nil // fails below
		}
		switch behind {
		case "fail":
			return errHMBoom
		case "remove":
			if ok, err := m.svc.Release(ctx, owner, ref); !ok || err != nil {
				return errors.Join(errors.New("could not remove the lock behind Do's back"), err)
			}
		case "pause-and-takeover":
			m.clk.Pause() // no timer fires until the process resumes
			m.clk.Set(l.ExpiresAt.Add(time.Millisecond))
			var err error
			if took, err = m.other.Acquire(ctx, hmOther, ref, hmTTLs[0]); err != nil {
				return errors.Join(errors.New("another process could not take the expired lock"), err)
			}
		}
		return nil
	})
	switch {
	case holder != nil && ran:
		t.Fatalf("Do by %q ran its function on %s (token %d) while handle %d (owner %q, token %d) holds it",
			owner, ref, mine.Token, holder.id, holder.owner, holder.token)
	case holder != nil || active:
		var conflict *domain.LockConflictError
		if ran || !errors.As(err, &conflict) {
			t.Fatalf("Do by %q of %s held by %v: ran %v, got %v; want a conflict", owner, ref, m.rowString(ref), ran, err)
		}
		return
	case !ran:
		var conflict *domain.LockConflictError
		if m.stale(ref, now) && errors.As(err, &conflict) {
			return // a live handle that lost its lock may still keep others out
		}
		t.Fatalf("Do by %q of free %s did not run: %v", owner, ref, err)
	}
	m.newToken(t, "Do", mine.Token)
	hs := &hmHandle{id: -1, owner: owner, ref: ref, token: mine.Token}
	delete(m.rows, ref) // Do took the resource (perhaps over an expired lock); it is released or removed since
	switch behind {
	case "nothing", "fail":
		if behind == "fail" && !errors.Is(err, errHMBoom) || behind == "nothing" && err != nil {
			t.Fatalf("Do (%s) of %s: %v", behind, ref, err)
		}
		var lost *domain.LockLostError
		if errors.As(err, &lost) {
			t.Fatalf("Do (%s) of %s reports a loss it did not suffer: %v", behind, ref, err)
		}
	case "remove":
		if err == nil {
			t.Fatalf("Do by %q of %s returned nil though its lock (token %d) was removed while its function ran", owner, ref, mine.Token)
		}
		m.checkLoss(t, "Do", hs, err, mine.ExpiresAt, m.now(), false)
	case "pause-and-takeover":
		m.newToken(t, "another process's Acquire", took.Token)
		m.rows[ref] = hmRow{token: took.Token, owner: took.Owner, expires: took.ExpiresAt}
		if err == nil {
			t.Fatalf("Do by %q of %s returned nil though its lock (token %d) expired and %q took it (token %d) while its function ran",
				owner, ref, mine.Token, took.Owner, took.Token)
		}
		m.checkLoss(t, "Do", hs, err, mine.ExpiresAt, m.now(), false)
		// The process resumes: its timers fire.
		m.moveTo(t, m.clk.Now())
	}
}

// RemoveBehind releases an owner's lock through the owner-scoped call,
// as an operator or another part of the program does.
func (m *hmMachine) RemoveBehind(t *rapid.T) {
	owner, ref, _ := m.draw(t)
	if rapid.Bool().Draw(t, "all") {
		n, err := m.svc.ReleaseAllForOwner(m.ctx, owner)
		want := 0
		for r, row := range m.rows {
			if row.owner == owner {
				delete(m.rows, r)
				want++
			}
		}
		if err != nil || n != want {
			t.Fatalf("ReleaseAllForOwner(%q): got %d, %v; model says %d", owner, n, err, want)
		}
		return
	}
	ok, err := m.svc.Release(m.ctx, owner, ref)
	row, had := m.rows[ref]
	want := had && row.owner == owner
	if want {
		delete(m.rows, ref)
	}
	if err != nil || ok != want {
		t.Fatalf("Release(%q, %s): got %v, %v; model says %v", owner, ref, ok, err, want)
	}
}

// Cleanup purges expired locks, from another process.
func (m *hmMachine) Cleanup(t *rapid.T) {
	n, err := m.other.CleanupExpired(m.ctx)
	now, want := m.now(), 0
	for r, row := range m.rows {
		if !now.Before(row.expires) {
			delete(m.rows, r)
			want++
		}
	}
	if err != nil || n != want {
		t.Fatalf("CleanupExpired: got %d, %v; model says %d", n, err, want)
	}
}

// Acquire takes a lock through the owner-scoped call: another process's
// owner (a takeover once the lock expired), or one of this process's
// owners again after its lock was removed (a new acquisition of the same
// owner, which a stale handle of that owner must never adopt).
func (m *hmMachine) Acquire(t *rapid.T) {
	owner := rapid.SampledFrom(append([]string{hmOther}, hmOwners...)).Draw(t, "owner")
	ref := rapid.SampledFrom(hmRefs).Draw(t, "ref")
	svc := m.svc
	if owner == hmOther {
		svc = m.other
	}
	now := m.now()
	if h := m.holder(ref, now); h != nil && h.owner == owner {
		t.Skip("a re-entry by the holder's own owner: the owner-scoped rule, not the handle's")
	}
	l, err := svc.Acquire(m.ctx, owner, ref, hmTTLs[0])
	row, ok := m.rows[ref]
	switch {
	case ok && now.Before(row.expires) && row.owner != owner:
		var conflict *domain.LockConflictError
		if !errors.As(err, &conflict) || conflict.Holder.Token != row.token {
			t.Fatalf("Acquire by %q of %s held by %v: got %v; want a conflict", owner, ref, m.rowString(ref), err)
		}
	case err != nil:
		t.Fatalf("Acquire by %q of %s (store: %v): %v", owner, ref, m.rowString(ref), err)
	case ok && now.Before(row.expires): // re-entry
		if l.Token != row.token {
			t.Fatalf("re-entrant Acquire by %q of %s: token %d, want %d", owner, ref, l.Token, row.token)
		}
		// A re-entry extends, never shortens: the later expiry stands.
		if l.ExpiresAt.Before(row.expires) {
			t.Fatalf("re-entrant Acquire by %q of %s (store: %v): expires %s, shortened from %s", owner, ref, m.rowString(ref), l.ExpiresAt, row.expires)
		}
		row.expires = l.ExpiresAt
		m.rows[ref] = row
	default:
		m.newToken(t, "Acquire", l.Token)
		m.rows[ref] = hmRow{token: l.Token, owner: owner, expires: l.ExpiresAt}
	}
}

// Close closes this process's service: every keep-alive has ended with
// the loss "service closed" when Close returns. The process then starts
// again, with a new service on the same store; its old locks stay until
// they expire.
func (m *hmMachine) Close(t *rapid.T) {
	if rapid.IntRange(0, 4).Draw(t, "closeNow") != 0 {
		t.Skip("Close only now and then")
	}
	if err := m.svc.Close(m.ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, hs := range m.live() {
		if hs.kept && !hs.ended {
			if !finished(hs.h.Done()) || hs.held.Err() == nil {
				t.Fatalf("Close returned before the keep-alive of handle %d ended", hs.id)
			}
			m.checkLoss(t, "the keep-alive at Close", hs, hs.h.Err(), hs.h.Lock().ExpiresAt, m.now(), true)
		}
		hs.released = true
	}
	svc, err := application.NewLockService(m.repo, m.clk, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.svc = svc
}
