package locktest_test

import (
	"flag"
	"fmt"
	"testing"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/locktest"
)

// The whole conformance test of a store is one call, in a test function of
// the store's package, with a function that makes a new, empty store for
// each subtest:
//
//	func TestLockRepository(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) application.LockRepository {
//			return mystore.New()
//		})
//	}
//
// Here the same call checks the module's in-memory store, run as a test
// function would be (runAsTest), and prints the verdict.
func ExampleRun() {
	ok := runAsTest("ExampleRun", func(t *testing.T) {
		locktest.Run(t, func(t *testing.T) application.LockRepository {
			return memory.NewLockRepository()
		})
	})
	fmt.Println("the memory store keeps every promise:", ok)
	// Output: the memory store keeps every promise: true
}

// runAsTest runs fn as the test function name, as go test would, and
// reports whether it passed. It exists for the example only: a store's
// own test calls locktest.Run with its *testing.T. The test is named as
// the example, so that a -run pattern that selects the example selects it;
// -v is off while it runs, so that the example's output is only its own.
func runAsTest(name string, fn func(t *testing.T)) bool {
	if v := flag.Lookup("test.v"); v != nil {
		was := v.Value.String()
		_ = v.Value.Set("false")
		defer func() { _ = v.Value.Set(was) }()
	}
	match := func(pat, str string) (bool, error) { return true, nil }
	return testing.RunTests(match, []testing.InternalTest{{Name: name, F: fn}})
}
