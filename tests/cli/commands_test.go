package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// date is an instant of human output, without its zone. In the patterns
// below, an alternative always sits in a group, (?:a|b): a bare | would
// split the whole pattern in two, each half of which matches far more.
const date = `\d{4}-\d\d-\d\d \d\d:\d\d:\d\d`

// TestCLI_Commands runs every row of the command table of issue 3, in order
// on one database: each subtest starts from the state the previous left.
func TestCLI_Commands(t *testing.T) {
	t.Parallel()
	a := newAgents(t)
	var first lock

	t.Run("AcquireAcquired", func(t *testing.T) {
		r := a.mustRun("--json", "--owner", "A", "locks", "acquire", "plan", "p1")
		var obj map[string]any
		r.decode(t, &obj)
		assertKeys(t, obj, append(lockKeys, "reentered")...)
		assert.Equal(t, false, obj["reentered"])
		r.decode(t, &first)
		assert.Equal(t, "A", first.OwnerID)
		assert.Equal(t, "plan", first.ResourceType)
		assert.Equal(t, "p1", first.ResourceID)
		assert.Equal(t, "UTC", first.ExpiresAt.Location().String())
		assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`, obj["expires_at"])

		r = a.mustRun("--owner", "A", "locks", "acquire", "project", "x", "--ttl", "300")
		assert.Regexp(t, `^Acquired project/x for owner "A" \(token \d+\)\.\n`, r.stdout)
		assert.Regexp(t, `acquired  `+date+` UTC \(now\)\n`, r.stdout)
		assert.Regexp(t, `expires   `+date+` UTC \((?:in 4m59s|in 5m)\)\n`, r.stdout)
	})
	t.Run("AcquireReentered", func(t *testing.T) {
		var l struct {
			lock
			Reentered bool `json:"reentered"`
		}
		a.mustRun("--json", "--owner", "A", "locks", "acquire", "plan", "p1").decode(t, &l)
		assert.Equal(t, first.Token, l.Token)
		assert.True(t, l.Reentered)
		r := a.mustRun("--owner", "A", "locks", "acquire", "plan", "p1")
		assert.Contains(t, r.stdout, `Re-entered plan/p1 for owner "A"`)
	})
	t.Run("AcquireHeldByAnotherOwner", func(t *testing.T) {
		r := a.run("--json", "--owner", "B", "locks", "acquire", "plan", "p1")
		assert.Equal(t, 3, r.code)
		assertConflict(t, r, "A")
	})
	t.Run("RenewExtends", func(t *testing.T) {
		r := a.mustRun("--json", "--owner", "A", "locks", "renew", "plan", "p1", "--ttl", "10m")
		var obj map[string]any
		r.decode(t, &obj)
		assertKeys(t, obj, lockKeys...)
		var l lock
		r.decode(t, &l)
		assert.Equal(t, first.Token, l.Token)
		assert.True(t, l.ExpiresAt.After(first.ExpiresAt))

		r = a.mustRun("--owner", "A", "locks", "renew", "plan", "p1")
		assert.Contains(t, r.stdout, `Renewed plan/p1 for owner "A"`)
	})
	t.Run("RenewNotHeld", func(t *testing.T) {
		r := a.run("--json", "--owner", "A", "locks", "renew", "plan", "p9")
		assert.Equal(t, 4, r.code)
		assertError(t, r, "expired")
		assert.Contains(t, r.stderr, `owner "A" holds no lock on plan/p9; acquire it again`)
		var doc struct{ Error map[string]any }
		r.decode(t, &doc)
		assert.Equal(t, "not_held", doc.Error["reason"], "never held is told from expired")
		assert.NotContains(t, doc.Error, "expired_at")
	})
	t.Run("RenewHeldByAnotherOwner", func(t *testing.T) {
		r := a.run("--json", "--owner", "B", "locks", "renew", "plan", "p1")
		assert.Equal(t, 3, r.code)
		assertConflict(t, r, "A")
	})
	t.Run("ReleaseNothing", func(t *testing.T) {
		r := a.mustRun("--json", "--owner", "B", "locks", "release", "plan", "p1")
		var doc struct {
			Released bool           `json:"released"`
			OwnerID  string         `json:"owner_id"`
			Holder   map[string]any `json:"holder"`
		}
		r.decode(t, &doc)
		assert.False(t, doc.Released)
		assert.Equal(t, "B", doc.OwnerID)
		require.NotNil(t, doc.Holder, "another owner's lock is named: %s", r.stdout)
		assertKeys(t, doc.Holder, lockKeys...)
		assert.Equal(t, "A", doc.Holder["owner_id"])
		assert.Equal(t, float64(first.Token), doc.Holder["token"])

		r = a.mustRun("--json", "--owner", "B", "locks", "release", "plan", "free")
		assert.JSONEq(t, `{"released": false, "owner_id": "B", "resource_type": "plan", "resource_id": "free"}`, r.stdout,
			"a free resource has no holder")
		r = a.mustRun("--owner", "B", "locks", "release", "plan", "p1")
		assert.Contains(t, r.stdout, `Nothing released: plan/p1 is held by owner "A", not by "B"`)
	})
	t.Run("ReleaseReleased", func(t *testing.T) {
		r := a.mustRun("--owner", "A", "locks", "release", "project", "x")
		assert.Equal(t, "Released project/x, held by owner \"A\".\n", r.stdout)
		a.mustRun("--owner", "A", "locks", "acquire", "project", "x")
		r = a.mustRun("--json", "--owner", "A", "locks", "release", "project", "x")
		assert.JSONEq(t, `{"released": true, "owner_id": "A", "resource_type": "project", "resource_id": "x"}`, r.stdout)
	})
	t.Run("List", func(t *testing.T) {
		a.mustRun("--owner", "B", "locks", "acquire", "project", "y")
		var objs []map[string]any
		a.mustRun("--json", "locks", "list").decode(t, &objs)
		require.Len(t, objs, 2)
		for _, obj := range objs {
			assertKeys(t, obj, append(lockKeys, "expired")...)
			assert.Equal(t, false, obj["expired"])
		}
		var ls []lock
		a.mustRun("--json", "locks", "list", "--owner", "B").decode(t, &ls)
		require.Len(t, ls, 1)
		assert.Equal(t, "y", ls[0].ResourceID)
		a.mustRun("--json", "locks", "list", "--type", "plan").decode(t, &ls)
		require.Len(t, ls, 1)
		assert.Equal(t, "p1", ls[0].ResourceID)

		r := a.mustRun("locks", "list")
		assert.Regexp(t, `(?m)^TYPE +ID +OWNER +TOKEN +ACQUIRED +EXPIRES +STATUS$`, r.stdout)
		assert.Regexp(t, `(?m)^plan +p1 +A +\d+ +`+date+` UTC \((?:\S+ ago|now)\) +`+date+` UTC \(in \S+\) +active$`, r.stdout)
	})
	t.Run("ListAllMarksExpired", func(t *testing.T) {
		seedExpired(t, a.db, "old")
		var ls []lock
		a.mustRun("--json", "locks", "list", "--all").decode(t, &ls)
		require.Len(t, ls, 3)
		assert.Equal(t, "old", ls[0].ResourceID)
		assert.True(t, ls[0].Expired)

		r := a.mustRun("locks", "list", "--all")
		assert.Regexp(t, `(?m)^plan +old +ghost +.* ago\) +EXPIRED$`, r.stdout)
	})
	t.Run("Cleanup", func(t *testing.T) {
		r := a.mustRun("--json", "locks", "cleanup")
		var obj map[string]any
		r.decode(t, &obj)
		assertKeys(t, obj, "count")
		assert.Equal(t, 1.0, obj["count"])
		assert.Equal(t, "No expired locks to purge.\n", a.mustRun("locks", "cleanup").stdout)
		seedExpired(t, a.db, "old1", "old2")
		assert.Equal(t, "Purged 2 expired locks.\n", a.mustRun("locks", "cleanup").stdout)
	})
	t.Run("ReleaseAll", func(t *testing.T) {
		a.mustRun("--owner", "A", "locks", "acquire", "project", "z")
		r := a.mustRun("--json", "--owner", "A", "locks", "release-all")
		assert.JSONEq(t, `{"count": 2}`, r.stdout)
		r = a.mustRun("--owner", "A", "locks", "release-all")
		assert.Equal(t, "Released 0 locks of owner \"A\".\n", r.stdout)
		var ls []lock
		a.mustRun("--json", "locks", "list").decode(t, &ls)
		require.Len(t, ls, 1, "B's lock stays")
		assert.Equal(t, "B", ls[0].OwnerID)
	})
	t.Run("DiagnosticsOK", func(t *testing.T) {
		r := a.mustRun("--json", "diagnostics")
		var obj map[string]any
		r.decode(t, &obj)
		assertKeys(t, obj, "ok", "checks")
		assert.Equal(t, true, obj["ok"])
		var rep report
		r.decode(t, &rep)
		assert.Equal(t, []string{"database", "schema", "stale_locks", "active_locks", "orphaned_locks"}, rep.names())
		for _, c := range rep.Checks {
			assert.Equal(t, "ok", c.Status, c.Name)
			assert.NotEmpty(t, c.Detail, c.Name)
		}
		require.NotNil(t, rep.check("active_locks").Count)
		assert.Equal(t, 1, *rep.check("active_locks").Count)

		r = a.mustRun("diagnostics")
		assert.Regexp(t, `(?m)^  ok +active_locks +1 lock held; the oldest is project/y, held by "B" since .* UTC \(`, r.stdout)
		assert.Contains(t, r.stdout, "All checks passed.")
	})
	t.Run("DiagnosticsFails", func(t *testing.T) {
		missing := newAgents(t)
		r := missing.run("--json", "diagnostics")
		assert.Equal(t, 1, r.code)
		var rep report
		r.decode(t, &rep)
		assert.False(t, rep.OK)
		assert.Equal(t, "fail", rep.check("database").Status)
		assert.NoFileExists(t, missing.db)
	})
}

// assertConflict checks the output of a command refused because owner
// holds the lock: the JSON error with the holder, and the holder's times
// on stderr.
func assertConflict(t *testing.T, r result, owner string) {
	t.Helper()
	var doc struct {
		Error struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Holder  map[string]any `json:"holder"`
		} `json:"error"`
	}
	r.decode(t, &doc)
	assert.Equal(t, "conflict", doc.Error.Code)
	assert.Contains(t, doc.Error.Message, owner)
	assertKeys(t, doc.Error.Holder, lockKeys...)
	assert.Equal(t, owner, doc.Error.Holder["owner_id"])
	assert.Contains(t, r.stderr, `is held by another owner: "`+owner+`"`)
	assert.Regexp(t, `acquired  \S+ \S+ UTC \(`, r.stderr)
	assert.Regexp(t, `expires   \S+ \S+ UTC \(in \S+\)`, r.stderr)
	assert.Regexp(t, `\(\S+ left\)`, r.stderr)
}

// assertError checks a JSON error document and its code.
func assertError(t *testing.T, r result, code string) {
	t.Helper()
	var doc map[string]map[string]any
	r.decode(t, &doc)
	if code == "expired" {
		// An expired failure says why: the lock expired (and when), or was
		// never held.
		assert.Contains(t, []any{"expired", "not_held", "too_slow"}, doc["error"]["reason"])
		delete(doc["error"], "reason")
		delete(doc["error"], "expired_at")
	}
	assertKeys(t, doc["error"], "code", "message")
	assert.Equal(t, code, doc["error"]["code"])
	assert.NotEmpty(t, doc["error"]["message"])
}

// report is the JSON output of diagnostics.
type report struct {
	OK     bool          `json:"ok"`
	Checks []checkResult `json:"checks"`
}

type checkResult struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	Count  *int   `json:"count"`
}

func (r report) names() []string {
	var out []string
	for _, c := range r.Checks {
		out = append(out, c.Name)
	}
	return out
}

// check returns the check named name, or the zero check.
func (r report) check(name string) checkResult {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return checkResult{}
}
