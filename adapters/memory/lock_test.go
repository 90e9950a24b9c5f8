package memory_test

import (
	"testing"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/tests/contract"
)

func TestLockRepository_Contract(t *testing.T) {
	contract.Run(t, func(t *testing.T) application.LockRepository {
		return memory.NewLockRepository()
	})
}
