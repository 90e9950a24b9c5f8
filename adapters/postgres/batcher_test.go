package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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
		life:  context.Background(),
		group: &batchGroup{leftGroup: &leftGroup{}},
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

// The first write of a kind that finds nothing of its kind in flight
// yields before it runs alone; the writes that queue meanwhile (callers
// woken together by the answer of a batch of another kind) leave with it
// in one batch, rather than it alone and them in a batch beside it. The
// yield here waits until the three others have queued, so that the test
// does not depend on the scheduler's order.
func TestBatcher_TheFirstCallerTakesThoseThatQueueWhileItYields(t *testing.T) {
	f := newFakeBatcher()
	close(f.release)
	var lone atomic.Int32
	one := f.batcher.one
	f.batcher.one = func(ctx context.Context, req int) (int, error) {
		lone.Add(1)
		return one(ctx, req)
	}
	others := make(chan struct{})
	var first sync.Once
	f.batcher.yield = func() { first.Do(func() { <-others }) }

	var wg sync.WaitGroup
	call := func(i int) {
		wg.Go(func() {
			res, err := f.do(context.Background(), fakeRef(i), i)
			require.NoError(t, err)
			require.Equal(t, i, res)
		})
	}
	call(1)
	require.Eventually(t, func() bool {
		f.batcher.mu.Lock()
		defer f.batcher.mu.Unlock()
		return f.batcher.leading
	}, 10*time.Second, time.Millisecond)
	for i := 2; i <= 4; i++ {
		call(i)
	}
	require.Eventually(t, func() bool { return f.queued() == 3 }, 10*time.Second, time.Millisecond)
	close(others)
	answered := make(chan struct{})
	go func() { wg.Wait(); close(answered) }()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the writes that queued while the first one yielded never got their answers")
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, []int{4}, f.sizes, "the first caller and the three that queued while it yielded should share one batch")
	require.Zero(t, lone.Load(), "no write should have run alone")
}

// A write that finds nothing of its kind in flight, and that no other
// joins while it yields, runs its own statement, as a lone caller always
// has.
func TestBatcher_ALoneCallerRunsItsOwnStatement(t *testing.T) {
	f := newFakeBatcher()
	close(f.release)
	res, err := f.do(context.Background(), fakeRef(1), 1)
	require.NoError(t, err)
	require.Equal(t, 1, res)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Empty(t, f.sizes, "a lone write went through the batch statement")
}

// Callers that queue while the batch's goroutine yields, as callers woken
// together by the answer of a batch of another kind do, leave with it: the
// first of them does not take the batch before the others have queued.
// The yield here waits until all five have queued, so that the test does
// not depend on the scheduler's order.
func TestBatcher_GathersTheCallersThatQueueWhileItYields(t *testing.T) {
	f := newFakeBatcher()
	lone := f.goAlone(t)
	all := make(chan struct{})
	f.batcher.yield = func() { <-all }

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
	lone := f.goAlone(t)
	yielded := make(chan struct{})
	f.batcher.yield = func() { <-yielded }
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
