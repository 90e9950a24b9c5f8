package entstore

import (
	"strings"
	"testing"

	"entgo.io/ent/dialect"
)

// TestStatements pins the hot path's SQL, which the floor benchmark
// (bench_test.go) repeats by hand.
func TestStatements(t *testing.T) {
	sqlite := buildStatements(dialect.SQLite)
	for got, want := range map[string]string{
		sqlite.sel:      "SELECT `id`, `owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at` FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ?",
		sqlite.insert:   "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`) VALUES (?, ?, ?, ?, ?) RETURNING `id`",
		sqlite.extend:   "UPDATE `locks` SET `expires_at` = ? WHERE `id` = ? AND `expires_at` = ?",
		sqlite.delID:    "DELETE FROM `locks` WHERE `id` = ? AND `expires_at` = ?",
		sqlite.delOwned: "DELETE FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ? AND `owner_id` = ?",
		sqlite.delToken: "DELETE FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ? AND `id` = ? AND `expires_at` > ?",
	} {
		if got != want {
			t.Errorf("statement changed:\n got  %s\n want %s", got, want)
		}
	}
}

// TestRenewTokenSQL pins a handle's one-statement renewal to its token:
// without it, PostgreSQL would extend whatever lock the owner holds.
func TestRenewTokenSQL(t *testing.T) {
	if renewTokenSQL == renewSQL {
		t.Fatal("renewTokenSQL is renewSQL: the token is not in its WHERE")
	}
	const want = "AND id = $7::bigint AND EXISTS (SELECT FROM held)"
	if !strings.Contains(renewTokenSQL, want) {
		t.Errorf("renewTokenSQL does not name the token (%q):\n%s", want, renewTokenSQL)
	}
}
