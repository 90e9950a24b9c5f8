package entstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cleveragents/locks/domain"
)

// fakeBatcher is a batcher whose lone writes wait for release and whose
// batches record their sizes and answer at once.
type fakeBatcher struct {
	*batcher[int, int]
	release chan struct{}
	mu      sync.Mutex
	sizes   []int
}

func newFakeBatcher() *fakeBatcher {
	f := &fakeBatcher{release: make(chan struct{})}
	f.batcher = &batcher[int, int]{
		one: func(ctx context.Context, req int) (int, error) {
			select {
			case <-f.release:
				return req, nil
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		},
		many: func(_ context.Context, ops []*batchOp[int, int]) error {
			f.mu.Lock()
			f.sizes = append(f.sizes, len(ops))
			f.mu.Unlock()
			for _, op := range ops {
				op.res = op.req
			}
			return nil
		},
		everyBody: func(error) bool { return true },
		life:      context.Background(),
		group:     &batchGroup{},
	}
	return f
}

func fakeRef(i int) domain.ResourceRef {
	return domain.ResourceRef{Type: domain.ResourcePlan, ID: fmt.Sprint("plan-", i)}
}

// goAlone runs a lone write that holds the batcher's "alone" slot until
// f.release is closed, so that every write after it queues.
func (f *fakeBatcher) goAlone(t *testing.T) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = f.do(context.Background(), fakeRef(0), 0)
	}()
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.batcher.mu.Lock()
		defer f.batcher.mu.Unlock()
		return f.batcher.alone == 1
	}, 10*time.Second, time.Millisecond)
	return done
}

// Callers that queue while the batch's goroutine yields, as callers woken
// together by the answer of a batch of another kind do, leave with it: the
// first of them does not take the batch before the others have queued.
// The yield here waits until all five have queued, so that the test does
// not depend on the scheduler's order.
func TestBatcher_GathersTheCallersThatQueueWhileItYields(t *testing.T) {
	f := newFakeBatcher()
	all := make(chan struct{})
	f.batcher.yield = func() { <-all }
	lone := f.goAlone(t)

	var wg sync.WaitGroup
	for i := 1; i <= 5; i++ {
		wg.Go(func() {
			res, err := f.do(context.Background(), fakeRef(i), i)
			require.NoError(t, err)
			require.Equal(t, i, res)
		})
	}
	require.Eventually(t, func() bool { return f.queued() == 5 }, 10*time.Second, time.Millisecond)
	close(all)
	wg.Wait()
	close(f.release)
	<-lone

	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, []int{5}, f.sizes, "the five callers made ready together should share one batch")
}

// A batch whose callers all left before it was taken from the queue frees
// the queue: the next write is not held up by a batch that never went.
func TestBatcher_ABatchEveryCallerLeftBeforeItWentFreesTheQueue(t *testing.T) {
	f := newFakeBatcher()
	yielded := make(chan struct{})
	f.batcher.yield = func() { <-yielded }
	lone := f.goAlone(t)
	defer func() {
		close(f.release)
		<-lone
	}()

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.do(gone, fakeRef(1), 1)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, f.queued())
	close(yielded) // the batch's goroutine finds the queue empty
	require.Eventually(t, func() bool {
		f.batcher.mu.Lock()
		defer f.batcher.mu.Unlock()
		return !f.batcher.flying
	}, 10*time.Second, time.Millisecond, "the batch that every caller left before it went still holds the queue")

	answered := make(chan error, 1)
	go func() {
		_, err := f.do(context.Background(), fakeRef(2), 2)
		answered <- err
	}()
	select {
	case err := <-answered:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a write after a batch that every caller left never got its answer: the queue stayed held")
	}
}
