package postgres

import (
	"strings"
	"testing"
)

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
