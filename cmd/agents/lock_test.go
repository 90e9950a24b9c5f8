package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain_Acquire(t *testing.T) {
	t.Run("PrintsLockInLocalTime", func(t *testing.T) {
		h := newHarness(t)
		r := h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		assert.Equal(t, `Acquired plan/p1 for owner "alice" (token 1).
  acquired  2026-11-29 21:00:00 TST (now)
  expires   2026-11-29 21:05:00 TST (in 5m)
`, r.stdout)
	})
	t.Run("JSONIsTheLock", func(t *testing.T) {
		h := newHarness(t)
		r := h.mustRun("--json", "locks", "acquire", "project", "x", "--owner", "alice", "--ttl", "90")
		assert.JSONEq(t, `{"token": 1, "owner_id": "alice", "resource_type": "project", "resource_id": "x",
			"acquired_at": "2026-11-29T19:00:00.000000Z", "expires_at": "2026-11-29T19:01:30.000000Z", "reentered": false}`, r.stdout)
		h.clk.Add(time.Minute)
		r = h.mustRun("--json", "locks", "acquire", "project", "x", "--owner", "alice", "--ttl", "90")
		assert.JSONEq(t, `{"token": 1, "owner_id": "alice", "resource_type": "project", "resource_id": "x",
			"acquired_at": "2026-11-29T19:00:00.000000Z", "expires_at": "2026-11-29T19:02:30.000000Z", "reentered": true}`, r.stdout)
	})
	t.Run("ReentryInTheSameMicrosecondIsAReentry", func(t *testing.T) {
		// The clock need not move between the two: re-entry is what the
		// service decided, not a comparison of times.
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		r := h.mustRun("--json", "locks", "acquire", "plan", "p1", "--owner", "alice")
		assert.Contains(t, r.stdout, `"reentered": true`)
	})
	t.Run("ReentryKeepsTokenAndExtends", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		h.clk.Add(time.Minute)
		r := h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		assert.Contains(t, r.stdout, `Re-entered plan/p1 for owner "alice" (token 1).`)
		assert.Contains(t, r.stdout, "acquired  2026-11-29 21:00:00 TST (1m ago)")
		assert.Contains(t, r.stdout, "expires   2026-11-29 21:06:00 TST (in 5m)")
	})
	t.Run("ConflictNamesHolder", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		h.clk.Add(48 * time.Second)
		r := h.run("locks", "acquire", "plan", "p1", "--owner", "bob")
		assert.Equal(t, exitConflict, r.code)
		assert.Empty(t, r.stdout)
		assert.Contains(t, r.stderr, `plan/p1 is held by another owner: "alice" (token 1)`)
		assert.Contains(t, r.stderr, "acquired  2026-11-29 21:00:00 TST (48s ago)")
		assert.Contains(t, r.stderr, "expires   2026-11-29 21:05:00 TST (in 4m12s)")

		r = h.run("--json", "locks", "acquire", "plan", "p1", "--owner", "bob")
		assert.Equal(t, exitConflict, r.code)
		var doc struct{ Error errorDoc }
		r.decode(t, &doc)
		assert.Equal(t, "conflict", doc.Error.Code)
		require.NotNil(t, doc.Error.Holder)
		assert.Equal(t, mustLock(t, h, "plan", "p1"), *doc.Error.Holder)
		assert.Contains(t, r.stderr, `"alice"`, "the human message still goes to stderr")
	})
	t.Run("TakeoverAfterTTLGetsLargerToken", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "5s")
		h.clk.Add(5 * time.Second)
		var l lockDoc
		h.mustRun("--json", "locks", "acquire", "plan", "p1", "--owner", "bob").decode(t, &l)
		assert.Equal(t, "bob", l.OwnerID)
		assert.Equal(t, int64(2), l.Token)
	})
}

func TestMain_Renew(t *testing.T) {
	t.Run("Extends", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		h.clk.Add(time.Minute)
		r := h.mustRun("locks", "renew", "plan", "p1", "--owner", "alice", "--ttl", "10m")
		assert.Contains(t, r.stdout, `Renewed plan/p1 for owner "alice" (token 1).`)
		assert.Contains(t, r.stdout, "expires   2026-11-29 21:11:00 TST (in 10m)")
	})
	t.Run("ExpiredIsExit4", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "5s")
		h.clk.Add(5 * time.Second)
		r := h.run("--json", "locks", "renew", "plan", "p1", "--owner", "alice")
		assert.Equal(t, exitExpired, r.code)
		var doc struct{ Error errorDoc }
		r.decode(t, &doc)
		assert.Equal(t, "expired", doc.Error.Code)
		assert.Equal(t, reasonExpired, doc.Error.Reason)
		assert.Equal(t, "2026-11-29T19:00:05.000000Z", doc.Error.ExpiredAt)
		assert.Contains(t, r.stderr, "acquire it again")
	})
	t.Run("NotHeldIsExit4", func(t *testing.T) {
		h := newHarness(t)
		h.createStore()
		r := h.run("locks", "renew", "plan", "p1", "--owner", "alice")
		assert.Equal(t, exitExpired, r.code)
		assert.Contains(t, r.stderr, `owner "alice" holds no lock on plan/p1`)
		r = h.run("--json", "locks", "renew", "plan", "p1", "--owner", "alice")
		var doc struct{ Error errorDoc }
		r.decode(t, &doc)
		assert.Equal(t, errorDoc{Code: "expired", Message: doc.Error.Message, Reason: reasonNotHeld}, doc.Error)
	})
	t.Run("OtherOwnerIsExit3", func(t *testing.T) {
		h := newHarness(t)
		h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
		r := h.run("locks", "renew", "plan", "p1", "--owner", "bob")
		assert.Equal(t, exitConflict, r.code)
		assert.Contains(t, r.stderr, `"alice"`)
	})
}

func TestMain_Release(t *testing.T) {
	h := newHarness(t)
	h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")

	r := h.mustRun("locks", "release", "plan", "p1", "--owner", "bob")
	assert.Equal(t, "Nothing released: plan/p1 is held by owner \"alice\", not by \"bob\"; only its holder can release it.\n", r.stdout)

	var doc releaseDoc
	h.mustRun("--json", "locks", "release", "plan", "p1", "--owner", "bob").decode(t, &doc)
	require.NotNil(t, doc.Holder)
	assert.Equal(t, releaseDoc{Released: false, OwnerID: "bob", ResourceType: "plan", ResourceID: "p1",
		Holder: &lockDoc{Token: 1, OwnerID: "alice", ResourceType: "plan", ResourceID: "p1",
			AcquiredAt: "2026-11-29T19:00:00.000000Z", ExpiresAt: "2026-11-29T19:05:00.000000Z"}}, doc)

	doc = releaseDoc{}
	h.mustRun("--json", "locks", "release", "plan", "p1", "--owner", "alice").decode(t, &doc)
	assert.Equal(t, releaseDoc{Released: true, OwnerID: "alice", ResourceType: "plan", ResourceID: "p1"}, doc)

	r = h.mustRun("locks", "release", "plan", "p1", "--owner", "alice")
	assert.Equal(t, "Nothing released: owner \"alice\" holds no lock on plan/p1.\n", r.stdout)
}

func TestMain_ReleaseAll(t *testing.T) {
	h := newHarness(t)
	h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice")
	h.mustRun("locks", "acquire", "project", "x", "--owner", "alice")
	h.mustRun("locks", "acquire", "plan", "p2", "--owner", "bob")

	var n countDoc
	h.mustRun("--json", "locks", "release-all", "--owner", "alice").decode(t, &n)
	assert.Equal(t, 2, n.Count)
	r := h.mustRun("locks", "release-all", "--owner", "alice")
	assert.Equal(t, "Released 0 locks of owner \"alice\".\n", r.stdout)
	assert.Equal(t, "bob", mustLock(t, h, "plan", "p2").OwnerID, "other owners keep their locks")
}

func TestMain_List(t *testing.T) {
	h := newHarness(t)
	h.createStore()
	assert.Equal(t, "No active locks.\n", h.mustRun("locks", "list").stdout)
	h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "5s")
	h.mustRun("locks", "acquire", "project", "x", "--owner", "bob")
	h.clk.Add(10 * time.Second)

	t.Run("AllMarksExpired", func(t *testing.T) {
		var ls []listedLock
		h.mustRun("--json", "locks", "list", "--all").decode(t, &ls)
		require.Len(t, ls, 2)
		assert.Equal(t, "p1", ls[0].ResourceID)
		assert.True(t, ls[0].Expired)
		assert.False(t, ls[1].Expired)

		r := h.mustRun("locks", "list", "--all")
		assert.Regexp(t, `plan +p1 +alice +2 +2026-11-29 21:00:00 TST \(10s ago\) +2026-11-29 21:00:05 TST \(5s ago\) +EXPIRED`, r.stdout)
	})
	t.Run("FiltersByType", func(t *testing.T) {
		var ls []listedLock
		h.mustRun("--json", "locks", "list", "--all", "--type", "project").decode(t, &ls)
		require.Len(t, ls, 1)
		assert.Equal(t, "x", ls[0].ResourceID)
	})
	t.Run("ActiveOnly", func(t *testing.T) {
		var ls []listedLock
		h.mustRun("--json", "locks", "list").decode(t, &ls)
		require.Len(t, ls, 1)
		assert.Equal(t, "bob", ls[0].OwnerID)
		assert.False(t, ls[0].Expired)
	})
	t.Run("EmptyIsAnArray", func(t *testing.T) {
		r := h.mustRun("--json", "locks", "list", "--type", "plan")
		assert.JSONEq(t, "[]", r.stdout)
	})
}

func TestMain_Cleanup(t *testing.T) {
	h := newHarness(t)
	h.mustRun("locks", "acquire", "plan", "p1", "--owner", "alice", "--ttl", "5s")
	h.mustRun("locks", "acquire", "plan", "p2", "--owner", "alice", "--ttl", "5s")
	h.mustRun("locks", "acquire", "plan", "p3", "--owner", "alice", "--ttl", "1h")
	h.clk.Add(5 * time.Second)

	var n countDoc
	h.mustRun("--json", "locks", "cleanup").decode(t, &n)
	assert.Equal(t, 2, n.Count, "cleanup counts what it purged, not what a startup cleanup left")
	assert.Equal(t, "No expired locks to purge.\n", h.mustRun("locks", "cleanup").stdout)
}

// mustLock reads the lock on a resource through the CLI.
func mustLock(t *testing.T, h *harness, typ, id string) lockDoc {
	t.Helper()
	var ls []listedLock
	h.mustRun("--json", "locks", "list", "--all", "--type", typ).decode(t, &ls)
	for _, l := range ls {
		if l.ResourceID == id {
			return l.lockDoc
		}
	}
	require.Failf(t, "no lock", "%s/%s", typ, id)
	return lockDoc{}
}
