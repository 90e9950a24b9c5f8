package entstore

import (
	"context"
	"math/rand/v2"
	"time"
)

// Retry runs fn, and runs it again, up to attempts times in all, while it
// fails with an error that retryable accepts, pausing a jittered, growing
// while between tries. It returns fn's last error, or the context's if the
// context ends during a pause. The adapters use it for the errors their
// database says a retry resolves (SQLite busy, PostgreSQL serialization
// failures and deadlocks).
func Retry(ctx context.Context, attempts int, retryable func(error) bool, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || !retryable(err) || attempt >= attempts {
			return err
		}
		if werr := backoff(ctx, attempt); werr != nil {
			return werr
		}
	}
}

// backoff waits before try number attempt+1: about 5 ms times 2^attempt,
// with jitter so that retrying processes do not collide again. It waits on
// a real timer: it paces I/O retries and has no bearing on lock expiry,
// which only ever reads the service's injected clock.
func backoff(ctx context.Context, attempt int) error {
	base := time.Duration(1<<attempt) * 5 * time.Millisecond
	t := time.NewTimer(base/2 + rand.N(base))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
