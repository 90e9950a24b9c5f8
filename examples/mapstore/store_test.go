package mapstore_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/locktest"

	"example.com/mapstore"
)

// envBug plants a bug in the store that TestStore checks: the planted-bug
// test sets it in a child run of this test binary.
const envBug = "MAPSTORE_BUG"

// childTimeout bounds a child run of the suite: it takes well under a
// second on this store, and a hung one is a failure, not a hung test.
// The mutex-leak bug takes about a minute (two under -race): locktest's
// watchdog waits 30 s (60 s) for the first call that hangs, 3 s for each
// later one.
const childTimeout = 4 * time.Minute

// TestStore is the store's whole conformance test.
func TestStore(t *testing.T) {
	bug := mapstore.Bug(os.Getenv(envBug))
	locktest.Run(t, func(t *testing.T) application.LockRepository { return mapstore.New(bug) })
}

// TestStore_PlantedBugs runs TestStore again, in a child process, with
// each planted bug, and checks that the suite fails it, naming the broken
// promises. Run it with -v to see what the suite printed.
func TestStore_PlantedBugs(t *testing.T) {
	if os.Getenv(envBug) != "" {
		t.Skip("the child run checks the store only")
	}
	for _, tc := range []struct {
		bug    mapstore.Bug
		caught []string // subtests that must fail
	}{
		{mapstore.BugExpiryBoundary, []string{"TestStore/CleanupExpired/Boundary", "TestStore/StaleCount"}},
		{mapstore.BugTokenReuse, []string{"TestStore/FencingToken"}},
		{mapstore.BugOwnerFold, []string{"TestStore/ExactBytes/OwnersAreExactBytes"}},
		{mapstore.BugNoLimit, []string{"TestStore/Repository/DeleteExpiredAtMostLimit"}},
		{mapstore.BugFullBatches, []string{"TestStore/Repository/DeleteExpiredAtMostLimit", "TestStore/CleanupExpired/Boundary"}},
		{mapstore.BugNoneZero, []string{"TestStore/Repository/ChangeNoneReturnsTheLock"}},
		{mapstore.BugTokenEarly, []string{"TestStore/Concurrency/HandoffsNeverOverlap"}},
		// A store that hangs fails each subtest it hangs, promptly, with
		// the stuck call named, rather than at the child's timeout.
		{mapstore.BugMutexLeak, []string{"TestStore/Acquire/ConflictNamesHolder", "TestStore/Concurrency/ExactlyOneWinner",
			"TestStore/Repository/DecideErrorUnchanged"}},
	} {
		t.Run(string(tc.bug), func(t *testing.T) {
			// A suite that hangs on the bug fails in the child, at its own
			// timeout, naming the subtest it hung in: never an orphan that
			// outlives this test.
			cmd := exec.Command(os.Args[0], "-test.run=^TestStore$", "-test.count=1", "-test.timeout="+childTimeout.String())
			cmd.Env = append(os.Environ(), envBug+"="+string(tc.bug))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed a store with the %s bug (err %v):\n%s", tc.bug, err, out)
			}
			if strings.Contains(string(out), "test timed out") {
				t.Errorf("the suite hung on the %s bug until the child's timeout (%s), instead of failing the subtests it hung in:\n%s",
					tc.bug, childTimeout, out)
			}
			for _, name := range tc.caught {
				if !strings.Contains(string(out), "--- FAIL: "+name+" ") {
					t.Errorf("the suite did not report %s:\n%s", name, out)
				}
			}
			t.Logf("what the suite printed for the %s bug:\n%s", tc.bug, out)
		})
	}
}
