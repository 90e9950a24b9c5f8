package locktest_test

import (
	"testing"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/locktest"
)

// The whole conformance test of a store is one call, in a test function of
// the store's package, with a function that makes a new, empty store for
// each subtest. Run reports to the *testing.T of a running test, so this
// example is compiled but not run: adapters/memory/lock_test.go runs
// exactly this, and examples/mapstore shows a store of another module.
func ExampleRun() {
	testLockRepository := func(t *testing.T) { // func TestLockRepository(t *testing.T)
		locktest.Run(t, func(t *testing.T) application.LockRepository {
			return memory.NewLockRepository()
		})
	}
	_ = testLockRepository
}
