package hosts

import (
	"sort"
	"time"
)

// checkChanges is the linearizability check: it holds the server's log of
// the locks table to a single correct lock per resource, and each host's
// view to that log.
//
// Every change of a resource's row is made under that row's lock (and
// most under the resource's advisory lock too), so the log's order is the
// order in which they took effect: each change is its operation's
// linearization point, within the operation, as the log's time is before
// the commit and each host records its event after it. What remains to
// check is that, in that order, each change is one a single lock could
// make, judged at the server's time of the change:
//   - a grant finds the resource free (the previous row deleted), draws a
//     token above every earlier one, and takes over (deletes in its own
//     transaction) only a lock that had expired, or a gone process's on
//     the taker's own host;
//   - an extension extends the resource's current token, decided before
//     it expired: the renewal decides on its owner's estimate of the
//     server's time, which its statement may reach much later (the
//     latency fault), so it is held against the expiry only when both its
//     logged time and its decision (the new expiry less the lock's TTL,
//     the grant's expiry less its acquisition time) came after the expiry
//     by more than the uncertainty its owner stated and the slack;
//   - a deletion deletes the current token; before its expiry, other
//     than by a takeover, only as its holder's release once its work is
//     done (removed-while-held);
//
// and that every grant, renewal and release a host was told of is in the
// log before the host recorded it, with the same owner (a release that a
// server restart undid excepted: recorded just before the restart, or
// during it, before the server had taken the signal to stop).
func checkChanges(sorted []Event, changes []Change, lim Limits, add func(kind, format string, args ...any)) {
	if len(changes) == 0 {
		return
	}
	log := inOrder(changes)

	hostOf := map[string]string{}     // owner → host
	unc := map[string]time.Duration{} // owner → the largest uncertainty it stated
	reported := map[claimKey]Event{}  // token → its taker's acquired event
	for _, e := range sorted {
		if e.Owner != "" && e.Host != "" {
			hostOf[e.Owner] = e.Host
		}
		unc[e.Owner] = max(unc[e.Owner], e.Uncertainty)
		if k := (claimKey{e.Resource, e.Token}); e.Kind == KindAcquired {
			if _, ok := reported[k]; !ok {
				reported[k] = e
			}
		}
	}
	// deadHolder: the grant g could take over d's lock before it expired.
	deadHolder := func(d, g Change) bool {
		if e, ok := reported[claimKey{g.Resource, g.Token}]; ok {
			return e.DeadHolder
		}
		h := hostOf[d.Owner] // a taker that never reported: its host's
		return h != "" && h == hostOf[g.Owner] && d.Owner != g.Owner
	}

	type state struct {
		held    bool
		cur     Change // the current row, as last changed
		deleted *Change
		top     int64         // the highest token granted
		ttl     time.Duration // the current lock's, from its grant; 0 unknown
	}
	res := map[string]*state{}
	takeovers := map[int64]bool{} // the deletions that a grant in their transaction followed
	for i := range log {
		c := log[i]
		s := res[c.Resource]
		if s == nil {
			s = &state{}
			res[c.Resource] = s
		}
		switch c.Op {
		case ChangeGrant:
			if s.held {
				add(VLinear, "%s: token %d granted to %s at %s while token %d of %s stood",
					c.Resource, c.Token, c.Owner, stamp(c.At), s.cur.Token, s.cur.Owner)
			}
			if c.Token <= s.top {
				add(VTokenOrder, "%s: token %d granted at %s after token %d", c.Resource, c.Token, stamp(c.At), s.top)
			}
			if d := s.deleted; d != nil && d.Tx == c.Tx {
				takeovers[d.ID] = true
			}
			if d := s.deleted; d != nil && d.Tx == c.Tx && d.Expires.After(d.At) && !deadHolder(*d, c) {
				add(VEarlyTakeover, "%s: %s was granted token %d at %s (the server's log), taking over %s's token %d %v before it expired at %s",
					c.Resource, c.Owner, c.Token, stamp(c.At), d.Owner, d.Token, d.Expires.Sub(d.At).Round(time.Millisecond), stamp(d.Expires))
			}
			s.held, s.cur, s.deleted, s.top = true, c, nil, max(s.top, c.Token)
			s.ttl = 0
			if !c.Acquired.IsZero() {
				s.ttl = c.Expires.Sub(c.Acquired)
			}
		case ChangeExtend:
			switch {
			case !s.held || s.cur.Token != c.Token:
				add(VLinear, "%s: token %d of %s extended at %s, not the resource's lock", c.Resource, c.Token, c.Owner, stamp(c.At))
			case lapsed(s.cur.Expires, c.At, c.Expires.Add(-s.ttl), unc[c.Owner]+lim.EventSlack):
				add(VLinear, "%s: token %d of %s extended at %s (decided at %s on its estimate), %v after it expired at %s",
					c.Resource, c.Token, c.Owner, stamp(c.At), stamp(c.Expires.Add(-s.ttl)), c.At.Sub(s.cur.Expires).Round(time.Millisecond), stamp(s.cur.Expires))
			}
			if s.held && s.cur.Token == c.Token {
				s.cur = c
			}
		case ChangeDelete:
			if !s.held || s.cur.Token != c.Token {
				add(VLinear, "%s: token %d of %s deleted at %s, not the resource's lock", c.Resource, c.Token, c.Owner, stamp(c.At))
				continue
			}
			s.held, s.deleted = false, &log[i]
		}
	}

	// A deletion that was no takeover, of a row that had not expired: only
	// its holder may do that (a purge needs the expiry passed on the
	// server's clock), and it does so once its work is done. A holder
	// that still believed it held the lock after, or learned of its loss
	// after, did not: the lock was removed under it (a purge decided on
	// a wrong clock, a release by owner that took a sibling's newer lock).
	marks := map[claimKey][]Event{}
	for _, e := range sorted {
		if e.Kind == KindBelief || e.Kind == KindLost {
			k := claimKey{e.Resource, e.Token}
			marks[k] = append(marks[k], e)
		}
	}
	for _, d := range log {
		if d.Op != ChangeDelete || takeovers[d.ID] || !d.Expires.After(d.At) {
			continue
		}
		for _, m := range marks[claimKey{d.Resource, d.Token}] {
			if m.At.After(d.At) {
				add(VRemoved, "%s: token %d of %s deleted at %s, %v before it expired, while its holder still held it (%s at %s)",
					d.Resource, d.Token, d.Owner, stamp(d.At), d.Expires.Sub(d.At).Round(time.Millisecond), m.Kind, stamp(m.At))
				break
			}
		}
	}

	// Each host's view: what it was told had happened, had, before it
	// recorded it.
	byToken := map[claimKey][]Change{}
	for _, c := range log {
		k := claimKey{c.Resource, c.Token}
		byToken[k] = append(byToken[k], c)
	}
	// A release commits without waiting for its WAL to be written
	// (adapters/postgres/commit.go): a server stopped at once right after
	// loses it, and its lock comes back to expire, which is safe. The
	// restart's event is recorded as the harness begins to stop the
	// server, which takes signals some milliseconds later (more on a
	// loaded machine) and answers until then: a release recorded after
	// the event, up to the restart's end, may be one of those answers.
	lostInRestart := func(t time.Time) bool {
		for _, e := range sorted {
			if e.Kind == KindFault && e.Fault == FaultRestart && !t.Before(e.At.Add(-asyncCommitWindow)) && !t.After(e.End) {
				return true
			}
		}
		return false
	}
	seen := func(e Event, op string, match func(Change) bool) bool {
		for _, c := range byToken[claimKey{e.Resource, e.Token}] {
			if c.Op == op && !c.At.After(e.At) && match(c) {
				return true
			}
		}
		return false
	}
	for _, e := range sorted {
		switch e.Kind {
		case KindAcquired:
			if !seen(e, ChangeGrant, func(c Change) bool { return c.Owner == e.Owner }) {
				add(VLinear, "%s: %s recorded token %d at %s, which the server's log had not granted it by then",
					e.Resource, e.Owner, e.Token, stamp(e.At))
			}
		case KindRenewed:
			if !seen(e, ChangeExtend, func(c Change) bool { return (c.Expires.Sub(e.Expires)).Abs() < time.Millisecond }) {
				add(VLinear, "%s: %s recorded token %d renewed to %s at %s, which the server's log had not extended by then",
					e.Resource, e.Owner, e.Token, stamp(e.Expires), stamp(e.At))
			}
		case KindReleased:
			if !seen(e, ChangeDelete, func(Change) bool { return true }) && !lostInRestart(e.At) {
				add(VLinear, "%s: %s recorded token %d released at %s, which the server's log had not deleted by then",
					e.Resource, e.Owner, e.Token, stamp(e.At))
			}
		}
	}
}

// lapsed says whether an extension of a lock that expired at exp came too
// late: logged at at, decided at decided (the new expiry itself when the
// lock's TTL is unknown, which leaves at to judge alone), both more than
// slack after exp.
func lapsed(exp, at, decided time.Time, slack time.Duration) bool {
	late := exp.Add(slack)
	return at.After(late) && decided.After(late)
}

// asyncCommitWindow bounds how long PostgreSQL's WAL writer leaves an
// asynchronous commit unwritten: three wal_writer_delay, 200 ms by
// default, with room to spare.
const asyncCommitWindow = time.Second

// inOrder sorts the log by its serial, except that within one transaction
// a resource's deletion comes before its grant: the triggers of one
// statement's data-modifying parts fire at its end, in an order the
// statement does not promise, but the grant needed the deletion first.
func inOrder(changes []Change) []Change {
	log := append([]Change(nil), changes...)
	type group struct {
		tx  int64
		res string
	}
	first := map[group]int64{}
	for _, c := range log {
		if g := (group{c.Tx, c.Resource}); first[g] == 0 || c.ID < first[g] {
			first[g] = c.ID
		}
	}
	rank := map[string]int{ChangeDelete: 0, ChangeGrant: 1, ChangeExtend: 2}
	sort.Slice(log, func(i, j int) bool {
		a, b := log[i], log[j]
		fa, fb := first[group{a.Tx, a.Resource}], first[group{b.Tx, b.Resource}]
		if fa != fb {
			return fa < fb
		}
		if a.Tx == b.Tx && a.Resource == b.Resource && rank[a.Op] != rank[b.Op] {
			return rank[a.Op] < rank[b.Op]
		}
		return a.ID < b.ID
	})
	return log
}
