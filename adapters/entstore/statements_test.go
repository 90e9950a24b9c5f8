package entstore

import (
	"testing"

	"entgo.io/ent/dialect"
)

// TestStatements pins the hot path's SQL, which the floor benchmark
// (bench_test.go) repeats by hand.
func TestStatements(t *testing.T) {
	sqlite := buildStatements(dialect.SQLite)
	for got, want := range map[string]string{
		sqlite.sel:      "SELECT `id`, `owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`, `note` FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ?",
		sqlite.insert:   "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`, `note`) VALUES (?, ?, ?, ?, ?, ?) RETURNING `id`",
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
