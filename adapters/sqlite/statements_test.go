package sqlite

import "testing"

// TestStatements pins the hot path's SQL, which the floor benchmark
// (bench_test.go) repeats by hand.
func TestStatements(t *testing.T) {
	for got, want := range map[string]string{
		sqlSelect:      "SELECT `id`, `owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at` FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ?",
		sqlInsert:      "INSERT INTO `locks` (`owner_id`, `resource_type`, `resource_id`, `acquired_at`, `expires_at`) VALUES (?, ?, ?, ?, ?) RETURNING `id`",
		sqlExtend:      "UPDATE `locks` SET `expires_at` = ? WHERE `id` = ?",
		sqlDeleteID:    "DELETE FROM `locks` WHERE `id` = ?",
		sqlDeleteOwned: "DELETE FROM `locks` WHERE `resource_type` = ? AND `resource_id` = ? AND `owner_id` = ?",
	} {
		if got != want {
			t.Errorf("statement changed:\n got  %s\n want %s", got, want)
		}
	}
}
