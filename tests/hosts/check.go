package hosts

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// claim is one acquisition as the history shows it.
type claim struct {
	res, owner, host string
	token            int64
	acquired         time.Time // recorded after the acquisition committed
	granted          time.Time // the server's time of the grant, from its log; zero without one
	grantedTx        int64     // the grant's transaction, in the log
	expiries         []Event   // acquired and renewed events, in order of At
	beliefs          []mark    // the holder believed it held the lock at or after each
	lost             time.Time // zero unless its keep-alive context ended with a loss
	uncertainty      time.Duration
	stored           time.Time // the acquisition time the store wrote: its decision's now
	storedSkew       time.Duration
	storedUncert     time.Duration
	deadHolder       bool
	released         time.Time // the earliest record of its release; zero if none
	deleted          time.Time // when the server's log shows its row deleted; zero if never
	deletedTx        int64     // the deletion's transaction, in the log
	lastWrite        time.Time // when its holder's last fenced write ended: its work was done
}

// mark is a moment the holder still believed it held the lock, and the
// uncertainty it stated then for its estimate of the server's time.
type mark struct {
	at  time.Time
	unc time.Duration
}

// expiryAt is the latest expiry the holder had been given by t.
func (c *claim) expiryAt(t time.Time) time.Time {
	var e time.Time
	for _, ev := range c.expiries {
		if !ev.At.After(t) && ev.Expires.After(e) {
			e = ev.Expires
		}
	}
	return e
}

// grantedAt is when the lock changed hands: the server's own time of the
// grant when its log has one, else when the taker recorded it, later.
func (c *claim) grantedAt() time.Time {
	if !c.granted.IsZero() {
		return c.granted
	}
	return c.acquired
}

// gone is when the claim's lock was certainly gone: the earlier of the
// server's deletion of its row and its holder's record of the release.
func (c *claim) gone() time.Time {
	if c.released.IsZero() || (!c.deleted.IsZero() && c.deleted.Before(c.released)) {
		return c.deleted
	}
	return c.released
}

type claimKey struct {
	res   string
	token int64
}

// Check reads the history of a run that ended at end, and the tables, and
// returns every violation, in a stable order.
func Check(events []Event, tables Tables, end time.Time, lim Limits) []Violation {
	var out []Violation
	add := func(kind, format string, args ...any) {
		out = append(out, Violation{Kind: kind, Detail: fmt.Sprintf(format, args...)})
	}
	claims := map[claimKey]*claim{}
	get := func(e Event) *claim {
		k := claimKey{e.Resource, e.Token}
		c := claims[k]
		if c == nil {
			c = &claim{res: e.Resource, owner: e.Owner, host: e.Host, token: e.Token}
			claims[k] = c
		} else if c.owner != e.Owner {
			add(VTokenOrder, "%s token %d given to two owners, %s and %s", e.Resource, e.Token, c.owner, e.Owner)
		}
		return c
	}
	var faults []Event
	writes := map[string]Event{}
	sorted := append([]Event(nil), events...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].At.Before(sorted[j].At) })
	for _, e := range sorted {
		switch e.Kind {
		case KindAcquired:
			c := get(e)
			if c.acquired.IsZero() {
				c.acquired = e.At
				c.stored, c.storedSkew, c.storedUncert, c.deadHolder = e.Stored, e.Skew, e.Uncertainty, e.DeadHolder
			}
			c.expiries = append(c.expiries, e)
		case KindRenewed:
			c := get(e)
			c.expiries = append(c.expiries, e)
		case KindReleased:
			if c := get(e); c.released.IsZero() {
				c.released = e.At
			}
		case KindBelief:
			c := get(e)
			c.beliefs = append(c.beliefs, mark{e.At, e.Uncertainty})
		case KindLost:
			c := get(e)
			if c.lost.IsZero() {
				c.lost, c.uncertainty = e.At, e.Uncertainty
			}
		case KindWrite:
			writes[e.Attempt] = e
			if e.Token != 0 {
				if c := get(e); e.At.After(c.lastWrite) {
					c.lastWrite = e.At
				}
			}
		case KindFault:
			faults = append(faults, e)
		}
	}
	// The server's log adds the grants that no host reported, and dates
	// every grant and deletion on the server's clock.
	for _, ch := range tables.Changes {
		k := claimKey{ch.Resource, ch.Token}
		c := claims[k]
		if c == nil {
			c = &claim{res: ch.Resource, owner: ch.Owner, token: ch.Token}
			claims[k] = c
		}
		switch {
		case ch.Op == ChangeGrant && c.granted.IsZero():
			c.granted, c.grantedTx = ch.At, ch.Tx
		case ch.Op == ChangeDelete && c.deleted.IsZero():
			c.deleted, c.deletedTx = ch.At, ch.Tx
		}
	}
	checkChanges(sorted, tables.Changes, lim, add)
	stopped := pauses(faults, lim.PauseSlack)
	byRes := map[string][]*claim{}
	for _, c := range claims {
		byRes[c.res] = append(byRes[c.res], c)
	}
	for _, cs := range byRes {
		sort.Slice(cs, func(i, j int) bool { return cs[i].token < cs[j].token })
	}

	// Two holders at once: a newer token granted before an older holder
	// last believed it still held the lock, by more than the uncertainty
	// that holder stated (its context ends on its estimate of the
	// server's time) and the scheduling of the goroutine that ends it.
	// The time its host was stopped does not count: it could hear
	// nothing then. The grant's time is the server's, from its log, so a
	// newer holder that never wrote, or never lived to report its grant,
	// still counts.
	for _, cs := range byRes {
		for i, a := range cs {
			for _, b := range cs[i+1:] {
				g := b.grantedAt()
				if g.IsZero() {
					continue
				}
				for _, m := range a.beliefs {
					if m.at.After(g) && stopped.running(a.host, g, m.at) > m.unc+lim.EventSlack {
						add(VOverlap, "%s: %s (token %d) took it at %s while %s (token %d) still held it at %s",
							a.res, b.owner, b.token, stamp(g), a.owner, a.token, stamp(m.at))
						break
					}
				}
			}
		}
	}

	// Granted before the previous lock expired on the server's clock: a
	// newer token whose stored acquisition time (the now of the decision
	// to grant it) is before an expiry that the older holder's lock had
	// been given by a renewal (or its acquisition) that had committed
	// before the newer acquisition began. "Before it began" is judged on
	// the real clock, from the newer host's estimate less its skew and
	// uncertainty, so a renewal that may have come after the decision is
	// never held against it. A lock released before the decision
	// (releasedFirst), or a dead process's lock taken over on its own
	// host, may go earlier.
	for _, cs := range byRes {
		for i, a := range cs {
			for _, b := range cs[i+1:] {
				if b.stored.IsZero() || b.deadHolder {
					continue
				}
				if releasedFirst(a, b, lim) {
					continue
				}
				began := b.stored.Add(-b.storedSkew - b.storedUncert - lim.EventSlack)
				var exp time.Time
				for _, ev := range a.expiries {
					if ev.At.Before(began) && ev.Expires.After(exp) {
						exp = ev.Expires
					}
				}
				if b.stored.Before(exp) {
					add(VEarlyTakeover, "%s: %s was granted token %d at %s (server time), %v before %s's token %d expired at %s",
						a.res, b.owner, b.token, stamp(b.stored), exp.Sub(b.stored).Round(time.Millisecond), a.owner, a.token, stamp(exp))
				}
			}
		}
	}

	// Told of the loss late: the loss, or a belief, more than the bound
	// (and the uncertainty the holder stated) after the expiry the holder
	// had been given, counting only the time its host ran.
	for _, cs := range byRes {
		for _, c := range cs {
			if len(c.expiries) == 0 {
				continue
			}
			if !c.lost.IsZero() {
				exp := c.expiryAt(c.lost)
				if ran := stopped.running(c.host, exp, c.lost); ran > lim.LossBound+c.uncertainty {
					add(VLateLoss, "%s: %s (token %d) learned of its loss at %s, %v after its expiry %s, %v of it running (its clock's uncertainty %v)",
						c.res, c.owner, c.token, stamp(c.lost), c.lost.Sub(exp).Round(time.Millisecond), stamp(exp), ran.Round(time.Millisecond), c.uncertainty)
				}
			}
			for _, m := range c.beliefs {
				exp := c.expiryAt(m.at)
				if ran := stopped.running(c.host, exp, m.at); ran > lim.LossBound+m.unc {
					add(VLateLoss, "%s: %s (token %d) still believed it held the lock at %s, %v after its expiry %s, %v of it running",
						c.res, c.owner, c.token, stamp(m.at), m.at.Sub(exp).Round(time.Millisecond), stamp(exp), ran.Round(time.Millisecond))
					break
				}
			}
		}
	}

	checkTables(tables, byRes, writes, add)
	checkEstimates(sorted, lim, add)

	// Recovery: after every fault, each host it touched commits a write
	// within the limit, unless another fault on it starts first or the
	// run ends.
	hosts := map[string]bool{}
	for _, e := range events {
		if e.Host != "" && e.Kind != KindFault {
			hosts[e.Host] = true
		}
	}
	for _, f := range faults {
		for h := range hosts {
			if f.Host != "" && f.Host != h {
				continue
			}
			deadline := f.End.Add(lim.Recovery)
			if deadline.After(end) {
				continue
			}
			interrupted := false
			for _, g := range faults {
				if (g.Host == "" || g.Host == h) && g.At.After(f.End) && g.At.Before(deadline) {
					interrupted = true
				}
			}
			if interrupted || committedBetween(sorted, h, f.End, deadline) {
				continue
			}
			add(VNoRecovery, "%s committed nothing within %v of the end of %s at %s",
				h, lim.Recovery, f.Fault, stamp(f.End))
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		return out[i].Kind+out[i].Detail < out[j].Kind+out[j].Detail
	})
	return out
}

// releasedFirst says whether a's lock may have been gone before b's grant
// was decided. The server's log says it exactly: a's row deleted before
// b's grant, by another transaction (a release or a purge, not b's
// takeover). Without it, the hosts' records: a release recorded no later
// than the decision could have been (a release recorded after it, as the
// release-all of a closing process is, excuses nothing); or a's work done
// before it (each section of the workload ends with its fenced write, and
// the release follows at once, but a release whose answer a fault kept
// from its holder is recorded nowhere: seen in a 10-minute run, a
// blackhole 1 ms after the write).
func releasedFirst(a, b *claim, lim Limits) bool {
	if !a.deleted.IsZero() && !b.granted.IsZero() {
		return a.deletedTx != b.grantedTx && !a.deleted.After(b.granted)
	}
	decided := b.stored.Add(-b.storedSkew + b.storedUncert + lim.EventSlack) // the latest it may have been
	if !a.released.IsZero() && !a.released.After(decided) {
		return true
	}
	return !a.lastWrite.IsZero() && !b.stored.Add(lim.EventSlack).Before(a.lastWrite)
}

// checkTables holds the tables to the rules: tokens strictly increasing
// per resource in the order of the inserts, no write landing after a
// newer token was granted or after its own lock was gone (the fence holds
// the lock's row until its transaction ends, so a release, a takeover or
// a purge comes after the write or the write is refused), every write
// where its host was told it is, and each plan's counter its committed
// transitions.
func checkTables(tables Tables, byRes map[string][]*claim, writes map[string]Event, add func(kind, format string, args ...any)) {
	rows := append([]Row(nil), tables.Rows...)
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	lastRow := map[string]Row{}
	transitions := map[string]int64{}
	inTable := map[string]bool{}
	for _, r := range rows {
		inTable[r.Attempt] = true
		if p, ok := lastRow[r.Resource]; ok && r.Token <= p.Token {
			add(VTokenOrder, "%s: write %s with token %d committed after write %s with token %d",
				r.Resource, r.Attempt, r.Token, p.Attempt, p.Token)
		}
		lastRow[r.Resource] = r
		if r.Kind == "transition" {
			transitions[r.Resource]++
		}
		stale := false
		for _, b := range byRes[r.Resource] {
			if g := b.grantedAt(); b.token > r.Token && !g.IsZero() && g.Before(r.At) {
				add(VStaleWrite, "%s: write %s of %s with token %d ran at %s, after %s took token %d at %s",
					r.Resource, r.Attempt, r.Owner, r.Token, stamp(r.At), b.owner, b.token, stamp(g))
				stale = true
				break
			}
		}
		for _, a := range byRes[r.Resource] {
			if gone := a.gone(); !stale && a.token == r.Token && !gone.IsZero() && gone.Before(r.At) {
				add(VWriteReleased, "%s: write %s of %s with token %d ran at %s, after its lock was gone at %s",
					r.Resource, r.Attempt, r.Owner, r.Token, stamp(r.At), stamp(gone))
			}
		}
		if w, ok := writes[r.Attempt]; ok && (w.Outcome == Refused || w.Outcome == Failed) {
			add(VRefusedWrote, "%s: write %s of %s (token %d) was %s, yet it is in the table",
				r.Resource, r.Attempt, r.Owner, r.Token, w.Outcome)
		}
	}
	for _, w := range writes {
		if w.Outcome == Committed && !inTable[w.Attempt] {
			add(VLostWrite, "%s: write %s of %s (token %d) committed, yet it is not in the table",
				w.Resource, w.Attempt, w.Owner, w.Token)
		}
	}
	for plan, n := range tables.Counters {
		if n != transitions[plan] {
			add(VCounter, "%s: counter %d, but %d transitions committed", plan, n, transitions[plan])
		}
	}
}

func committedBetween(sorted []Event, host string, from, to time.Time) bool {
	for _, e := range sorted {
		if e.Kind == KindWrite && e.Host == host && e.Outcome == Committed && e.At.After(from) && !e.At.After(to) {
			return true
		}
	}
	return false
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// Summary counts the history: operations by kind and outcome, faults by
// kind.
func Summary(events []Event) string {
	ops := map[string]int{}
	for _, e := range events {
		switch e.Kind {
		case KindWrite:
			ops["write "+e.Outcome]++
		case KindFault:
			ops["fault "+e.Fault]++
		default:
			ops[e.Kind]++
		}
	}
	keys := make([]string, 0, len(ops))
	for k := range ops {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, ops[k])
	}
	return b.String()
}
