package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

func pingRedis(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	return c.Ping(ctx).Err()
}

// redisLock is github.com/bsm/redislock on a local Redis: Obtain and
// Release, with a connection pool as large as the callers so that none
// waits for a connection.
type redisLock struct {
	addr   string
	prefix string
	client *redis.Client
}

func openRedislock(_ context.Context, env *environment) (instance, error) {
	env.mu.Lock()
	env.files++
	prefix := fmt.Sprintf("locks-bench:%d:%d:", pid, env.files)
	env.mu.Unlock()
	return &redisLock{addr: env.redisAddr, prefix: prefix}, nil
}

// callers cycle Obtain and Release; on the shared resource they retry at
// once while it is held, as the floors do.
func (r *redisLock) callers(_ context.Context, n int, shared bool) ([]cycleFunc, error) {
	r.client = redis.NewClient(&redis.Options{Addr: r.addr, PoolSize: max(n, 10)})
	locker := redislock.New(r.client)
	return perCaller(n, shared, func(ctx context.Context, _, id string) error {
		for {
			l, err := locker.Obtain(ctx, r.prefix+id, lockTTL, nil)
			if errors.Is(err, redislock.ErrNotObtained) && shared {
				continue
			}
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}), nil
}

func (r *redisLock) close() error {
	if r.client == nil {
		return nil
	}
	return r.client.Close()
}
