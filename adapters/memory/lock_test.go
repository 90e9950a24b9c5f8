package memory_test

import (
	"testing"

	"github.com/cleveragents/locks/adapters/memory"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/locktest"
)

func TestLockRepository_Contract(t *testing.T) {
	locktest.Run(t, func(t *testing.T) application.LockRepository {
		return memory.NewLockRepository()
	})
}
